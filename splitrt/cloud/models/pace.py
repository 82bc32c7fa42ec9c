"""An upload's pace: one averaging below ``min_rate_bytes_per_s`` after ``grace_s``, or past ``timeout_s``
(or its deadline), is cut (a read timeout per chunk does not bound a trickle holding a lane and quota).
``verdict`` is pure; ``Paced`` counts the chunks and its watch thread cancels the call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from splitrt.cloud.common import RpcFailure
from splitrt.errors import ConfigError
from splitrt.transport import splitrt_pb2 as pb

__all__ = ["Paced", "UploadPace", "verdict"]


@dataclass(frozen=True, kw_only=True)
class UploadPace:
    min_rate_bytes_per_s: float = 32 * 1024
    grace_s: float = 10.0
    timeout_s: float = 900.0

    def check(self) -> None:
        for name in ("min_rate_bytes_per_s", "grace_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"upload_pace.{name}: expected > 0, got {getattr(self, name)}")


def verdict(pace: UploadPace, *, elapsed_s: float, received_bytes: int, deadline_s: float) -> str | None:
    """Why an upload ``elapsed_s`` old that has received ``received_bytes`` must be cut (its deadline
    ``deadline_s`` after its start), or None."""
    if elapsed_s >= deadline_s:
        return f"expected the whole model within {deadline_s:g} s, got {received_bytes} bytes by then"
    if elapsed_s > pace.grace_s and received_bytes < pace.min_rate_bytes_per_s * elapsed_s:
        return (
            f"expected at least {pace.min_rate_bytes_per_s / 1024:g} KiB/s after {pace.grace_s:g} s, got "
            f"{received_bytes} bytes in {elapsed_s:.1f} s ({received_bytes / elapsed_s / 1024:.2f} KiB/s)"
        )
    return None


class Paced:
    """``chunks`` counted as they come; a watch thread cancels the call (``cancel(code, message)``) once
    ``verdict`` says so. The first chunk starts the clock at construction (the call's start)."""

    def __init__(
        self,
        chunks: Iterator[pb.ModelChunk],
        pace: UploadPace,
        cancel: Callable[[grpc.StatusCode, str], None],
        *,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._chunks = chunks
        self.pace = pace
        self._cancel = cancel
        self._clock = clock
        self.deadline_s = pace.timeout_s if deadline_s is None else min(deadline_s, pace.timeout_s)
        self.started_s = clock()
        self.received_bytes = 0
        self.cut: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="splitrt-upload-pace", daemon=True)
        self._thread.start()

    def _why(self) -> str | None:
        return verdict(
            self.pace,
            elapsed_s=self._clock() - self.started_s,
            received_bytes=self.received_bytes,
            deadline_s=self.deadline_s,
        )

    def _watch(self) -> None:
        while not self._done.wait(0.25):
            why = self._why()
            if why is not None:
                self.cut = f"upload cut: {why}; nothing stored"
                self._cancel(grpc.StatusCode.DEADLINE_EXCEEDED, self.cut)
                return

    def __iter__(self) -> Iterator[pb.ModelChunk]:
        try:
            for chunk in self._chunks:
                self.received_bytes += len(chunk.data)
                why = self._why()
                if why is not None:
                    raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, f"upload cut: {why}; nothing stored")
                yield chunk
        except grpc.RpcError as exc:  # the watch cancelled the call while the handler waited
            raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, self.cut or "upload: the call ended") from exc
        finally:
            self.close()

    def close(self) -> None:
        self._done.set()
