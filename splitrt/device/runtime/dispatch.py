"""One request's head output sent along its route: the servers of each tier the plan may use, in order, each
with what is left of the deadline once the local finish is kept in reserve (``deadline.budget``), and the
tail here when none answers (never a lost request).

- ``Dispatcher(local, clouds, hops, *, lock, clock, stats)``: ``.finish(table, head, cuts, codec, targets, *,
  t0, deadline_ms, now, device_factor) -> (SplitResult, Answer | None, why | None)``. A refused connection or
  a failing server is marked in its ``Clouds`` and the next one tried; a full queue (RESOURCE_EXHAUSTED with a
  retry hint) is a refusal, not a failure (``stats["refused"]``); an error of ours (a codec refusing NaN, a
  closed channel) finishes here and leaves the server up (``stats["local_errors"]``, ``last_local_error``);
  a splitrt server's INVALID_ARGUMENT is the tensors' fault: ``InputError``, not run again here. A relay's
  report of its next tier goes to ``Hops.next``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from splitrt.device.client.device import Device
from splitrt.device.client.messages import HeadResult, SplitResult
from splitrt.device.runtime import deadline
from splitrt.device.runtime.clouds import Cloud, Clouds
from splitrt.device.runtime.hops import Hops
from splitrt.errors import CloudError, InputError, SplitrtError
from splitrt.plan.costmodel import DEVICE_CUT, CostTable
from splitrt.plan.reserve import NOT_SENT
from splitrt.transport.v2 import is_v2

__all__ = ["Answer", "Dispatcher"]


@dataclass(frozen=True)
class Answer:
    """The server that answered a request: its tier, and the next cut it was sent (None: it finished)."""

    tier: int
    cloud: Cloud
    next_cut: str | None


class Dispatcher:
    """Sends for the runtime: its local ``Device`` (the fallback), its first tier's ``clouds`` and the
    later ``hops``, under its ``lock``, counting into its ``stats``."""

    def __init__(
        self,
        local: Device,
        clouds: Clouds,
        hops: Hops,
        *,
        lock: threading.RLock,
        clock: Callable[[], float],
        stats: dict[str, int],
    ) -> None:
        self.local, self.clouds, self.hops = local, clouds, hops
        self.lock, self.clock, self.stats = lock, clock, stats
        self.last_local_error = ""

    def finish(
        self,
        table: CostTable,
        head: HeadResult,
        cuts: tuple[str, ...],
        codec: str,
        targets: list[tuple[int, list[Cloud], str | None]],
        *,
        t0: float,
        deadline_ms: float,
        now: float,
        device_factor: float,
    ) -> tuple[SplitResult, Answer | None, str | None]:
        """The request's outputs, the server that answered (None: finished here), and why a tier the plan
        counted on did not (None: none failed). ``targets``: ``Hops.targets``; ``t0`` the request's start
        (``perf_counter``), ``device_factor`` the device's load factor (the local finish's price)."""
        cut = cuts[0]
        if cut == DEVICE_CUT:
            return self.local.finish_locally(head), None, None
        why: list[str] = [] if targets[0][1] else [f"{NOT_SENT}: no cloud available"]
        for tier, servers, next_cut in targets:
            clouds = self._servers(tier)
            for cloud in servers:
                timeout_ms = self._timeout_ms(table, cut, cloud.address, deadline_ms, t0, device_factor)
                if timeout_ms is None:  # no room left for the cloud: the tail runs here, within the deadline
                    why.append(f"{NOT_SENT}: {cloud.address}, deadline {deadline_ms:g} ms")
                    return self.local.finish_locally(head), None, "; ".join(why)
                sent_at = time.perf_counter()
                with clouds.on_wire(cloud):
                    try:
                        res = cloud.link.send(head, codec_spec=codec, timeout_s=timeout_ms / 1e3, next_cut=next_cut)
                    except CloudError as exc:
                        if exc.code == "INVALID_ARGUMENT" and not is_v2(cloud.address):
                            # A splitrt server runs this very segment: its refusal is the tensors' fault and
                            # the tail here would fail alike (a bad input runs once, not twice). A v2 engine
                            # has a model config of its own (static shapes, batch caps) that may refuse what
                            # the model accepts: that request still finishes here.
                            raise InputError(f"{cloud.address} refused the request's tensors: {exc}") from exc
                        why.append(f"{cloud.address}: {exc}")
                        if exc.retry_after_ms is not None:  # queue full: next cloud, or the tail here
                            clouds.refused(cloud, self.clock(), exc)
                            with self.lock:
                                self.stats["refused"] += 1
                        else:
                            clouds.mark_failed(cloud, self.clock(), exc)
                        continue
                    except (SplitrtError, ValueError) as exc:
                        # Not the cloud's fault (e.g. a lossy codec refusing inf/NaN, a channel closed under
                        # us): this request finishes locally, the cloud stays up.
                        with self.lock:
                            self.stats["local_errors"] += 1
                            self.last_local_error = f"{type(exc).__name__}: {exc}"
                        why.append(f"{cloud.address}: {self.last_local_error}")
                        return self.local.finish_locally(head), None, "; ".join(why)
                clouds.answered(cloud)
                # queued behind our own bandwidth probe: the plan's correction learns it (``feedback.correction``)
                waited_ms = min(max(0.0, res.network_ms), clouds.probe_wait_ms(sent_at, time.perf_counter()))
                res = replace(res, probe_wait_ms=waited_ms)
                answer = Answer(tier=tier, cloud=cloud, next_cut=next_cut)
                # Another server of the planned tier answering is no fallback; a later tier, or the
                # planned server finishing because its next tier failed, is.
                failed = why if tier != targets[0][0] else []
                relay = res.hops
                if relay is not None and tier <= len(self.hops.next):
                    with self.lock:
                        self.hops.next[tier - 1].reported(
                            self.clock(),
                            forwarded=relay.forwarded,
                            code=relay.next_error_code,
                            message=relay.next_error,
                        )
                    if next_cut not in (None, DEVICE_CUT) and not relay.forwarded:
                        failed.append(f"{cloud.address}'s next tier: {relay.next_error_code}: {relay.next_error}")
                return res, answer, "; ".join(failed) or None
        local = self.local.finish_locally(head)
        return local, None, "; ".join(why) or "no cloud answered"

    def _timeout_ms(
        self, table: CostTable, cut: str, address: str, deadline_ms: float, t0: float, device_factor: float
    ) -> float | None:
        """The RPC's timeout for ``cut`` at ``address`` (None: do not send): ``deadline.budget``; the first
        request of a cut to a server is cold (its tail's build)."""
        with self.lock:
            cold = (address, cut) not in self.clouds.sent
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            budget = deadline.budget(
                table, cut, device_factor=device_factor, deadline_ms=deadline_ms, elapsed_ms=elapsed_ms, cold=cold
            )
            if budget.sent:
                self.clouds.sent.add((address, cut))
        return budget.timeout_ms

    def _servers(self, tier: int) -> Clouds:
        return self.clouds if tier == 1 else self.hops.direct[tier - 2]
