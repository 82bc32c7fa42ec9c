"""Making sure a cloud has the model: the ``Status`` check (once per ``Device``, failures remembered for
``check_backoff_s``), and uploading the model when the cloud lacks it, inline or in the background.

Background uploads are keyed per (cloud, model sha256) in this process, not per ``Device``: the runtime
replaces a failed cloud's ``Device`` with a fresh one, which must find the upload already running.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from splitrt.device.client.config import DeviceConfig
from splitrt.errors import CloudError
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.base import Transport

# Background uploads in flight, per (cloud address, model sha256): one at a time in this process.
_UPLOADS: dict[tuple[str, str], threading.Thread] = {}
_UPLOADS_LOCK = threading.Lock()


class ModelUploader:
    """The model check and upload of one ``Device``: ``path``/``sha256`` its model, ``link()`` its transport
    (opened on first use), ``cloud()`` the cloud's name in messages and in the upload key."""

    def __init__(
        self, *, path: Path, sha256: str, config: DeviceConfig, link: Callable[[], Transport], cloud: Callable[[], str]
    ) -> None:
        self.path = path
        self.sha256 = sha256
        self.config = config
        self._link = link
        self._cloud = cloud
        self._lock = threading.Lock()
        # True once the cloud is known to have the model (tests set it for servers without Status).
        self.checked = False
        # A failed check, re-raised until the monotonic time given.
        self._failed: tuple[float, CloudError] | None = None

    def upload(self, timeout_s: float | None = None) -> pb.PutModelReply:
        """Stream the model file to the cloud (verified there by sha256)."""
        data = self.path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if sha != self.sha256:
            raise CloudError(
                f"model file {self.path} changed: expected sha256 {self.sha256}, got {sha}", code="FAILED_PRECONDITION"
            )
        step = self.config.upload_chunk_bytes

        def chunks() -> Iterator[pb.ModelChunk]:
            yield pb.ModelChunk(sha256=sha, name=self.path.name, total_bytes=len(data), data=data[:step])
            for i in range(step, len(data), step):
                yield pb.ModelChunk(data=data[i : i + step])

        return self._link().put_model(chunks(), timeout_s=timeout_s or self.config.upload_timeout_s)

    def ensure(self, force: bool = False, *, timeout_s: float | None = None, wait_upload: bool = True) -> None:
        """See ``Remote.ensure_model``."""
        if self.checked and not force:
            return
        now = time.monotonic()
        failed = self._failed
        if failed is not None and now < failed[0] and not force:
            raise CloudError(
                f"{failed[1]} (remembered for {failed[0] - now:.2f} s more)",
                code=failed[1].code,
                retryable=failed[1].retryable,
            )
        try:
            self._ensure(timeout_s, wait_upload)
        except CloudError as exc:
            with self._lock:
                self._failed = (time.monotonic() + self.config.check_backoff_s, exc)
            raise
        with self._lock:
            self.checked = True
            self._failed = None

    def _ensure(self, timeout_s: float | None, wait_upload: bool) -> None:
        st = self._link().status(timeout_s=timeout_s or self.config.timeout_s)
        if any(m.sha256 == self.sha256 for m in st.models):
            return
        cloud = self._cloud()
        if not (self.config.upload and st.allow_upload):
            why = "uploads disabled on this device" if not self.config.upload else "server refuses uploads"
            raise CloudError(
                f"cloud {cloud} lacks model {self.sha256[:12]} ({self.path}) and {why}",
                code="NOT_FOUND",
                retryable=False,
            )
        if wait_upload:
            self.upload()
            return
        key = (cloud, self.sha256)
        with _UPLOADS_LOCK:
            running = _UPLOADS.get(key)
            if running is None or not running.is_alive():
                running = threading.Thread(
                    target=self._background, args=(key,), daemon=True, name=f"splitrt-upload-{self.sha256[:8]}"
                )
                _UPLOADS[key] = running
                running.start()
        raise CloudError(
            f"cloud {cloud} lacks model {self.sha256[:12]} ({self.path}): expected it "
            "there, got an upload in progress (in the background; retry later)",
            code="UNAVAILABLE",
            retryable=True,
        )

    def _background(self, key: tuple[str, str]) -> None:
        try:
            self.upload()
        except Exception as exc:  # CloudError, or the channel closed under us: the next check retries
            with self._lock:
                err = (
                    exc
                    if isinstance(exc, CloudError)
                    else CloudError(f"upload of {self.path} to {self._cloud()} failed: {exc}", code="UNAVAILABLE")
                )
                self._failed = (time.monotonic() + self.config.check_backoff_s, err)
        else:
            with self._lock:
                self._failed = None
                self.checked = True
        finally:
            with _UPLOADS_LOCK:
                if _UPLOADS.get(key) is threading.current_thread():
                    del _UPLOADS[key]

    def in_progress(self) -> bool:
        """True while a background upload of this model to this cloud runs."""
        with _UPLOADS_LOCK:
            t = _UPLOADS.get((self._cloud(), self.sha256))
        return t is not None and t.is_alive()
