"""Device runtime: run the head of a model locally, ship the crossing tensors, get the outputs back.

``Device(model, "host:port").run(inputs, cut="c3")`` is the Python API apps use. The device holds the
whole model, so any request can also be finished locally: ``run_head`` then ``send`` (cloud) or
``finish_locally`` (tail on this machine) — the controller uses the latter as the fallback when
``send`` raises ``CloudError``.

The cloud is reached through a ``splitrt.transport.base.Transport``: by default a ``GrpcTransport``, one
gRPC channel per ``Device`` (reused, with keep-alive pings); every call has a deadline
(``DeviceConfig.timeout_s`` unless given). ``send(head, timeout_s=T)`` keeps the whole request, the
cloud's model check included, within ``T``.

The model check (``ensure_model``): a ``Status`` call, once per ``Device``; a failed check (unreachable,
timed out, model missing) is remembered for ``check_backoff_s`` and re-raised without an RPC. If the
cloud lacks the model and allows uploads (and ``DeviceConfig.upload``), ``ensure_model()`` uploads it
with its own ``upload_timeout_s``; on the request path with a deadline (``send(..., timeout_s=T)``) the
upload is never waited for: it starts in a background thread (one per cloud and model in this process)
and the request fails at once with a retryable ``CloudError`` (``UNAVAILABLE``), so the caller finishes
it locally and a later request finds the model there (``splitrt.device.client.upload``).

- ``Device(model_or_graph, "host:port", config=DeviceConfig(...))``: ``.run(inputs, cut=, codec_spec=)``,
  ``.run_detailed(...) -> SplitResult`` (outputs + head/encode/rpc/tail/queue ms, ``build_ms`` (the cloud built
  the tail session for this request: ``InferReply.build_ms``, never in ``queue_ms``), bytes, cloud load),
  ``.run_head(inputs, cut) -> HeadResult(crossing: what is sent, kept: graph outputs already here)``,
  ``.send(head, timeout_s=None) -> SplitResult`` (raises ``CloudError(code=<grpc status name>,
  retryable=...)``), ``.finish_locally(head) -> SplitResult`` (the fallback), ``.run_local(inputs)``,
  ``.stream(frames, cut=)``, ``.probe(up_bytes, down_bytes) -> ProbeResult``, ``.status(timeout_s=None)``. Cut
  ``device`` never touches the network. Three tiers: ``.send(head, ..., next_cut=B)`` asks an edge to run up to
  B and forward (``SplitResult.hops: Hops(edge_ms, next_ms, next_tail_ms, next_queue_ms, next_bytes_up/down,
  forwarded, next_error_code, ...)``); ``.probe(up, down, next_bytes=(up2, down2))`` probes through an edge
  (``ProbeResult.next_ms``, None when that hop failed).
- ``.ensure_model(force=False, *, timeout_s=None, wait_upload=True)``: one ``Status`` check per ``Device``; a
  failed check is re-raised without an RPC for ``check_backoff_s`` (``force`` bypasses). A missing model is
  uploaded if ``DeviceConfig.upload`` and the server allow it, with ``upload_timeout_s``: inline
  (``wait_upload``), or in a background thread (one per cloud and model per process; ``.upload_in_progress()``)
  while the call raises a retryable ``UNAVAILABLE``. ``send(head, timeout_s=T)`` keeps the whole request (check
  included) within ``T`` and never waits for an upload (background); ``send`` without ``timeout_s`` (the
  blocking API: ``run``, ``stream``, the CLI) uploads inline, then gives the call its full
  ``DeviceConfig.timeout_s``. Replies are decoded under a cap of 4 x ``max_message_bytes`` (a larger claimed
  tensor is ``DATA_LOSS``).
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from splitrt.device.client.config import DeviceConfig, read_token
from splitrt.device.client.inputs import InputChecks
from splitrt.device.client.messages import (
    HeadResult,
    ProbeResult,
    SplitResult,
    assemble,
    frame_result,
)
from splitrt.device.client.remote import Remote, SendOptions
from splitrt.device.client.sessions import SessionCache
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport.base import Transport

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack

# Importable from here as before the split (``splitrt.device.client`` is where apps and runtimes look).
__all__ = ["DEVICE_CUT", "Device", "DeviceConfig", "HeadResult", "ProbeResult", "SplitResult", "read_token"]

DEVICE_CUT = "device"

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _on_remote(method: Callable[Concatenate[Remote, _P], _R]) -> Callable[Concatenate[Device, _P], _R]:
    """``method`` called on a device's ``Remote``: a Device method of the same signature and docstring."""

    @functools.wraps(method)
    def on_remote(self: Device, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(self._remote, *args, **kwargs)

    return on_remote


class Device(InputChecks):
    """A model on this device, optionally paired with a cloud at ``cloud`` ("host:port").

    The cloud is reached through a ``Transport``: a ``GrpcTransport`` to ``cloud`` built on first use from
    the config (TLS, token, message limits), or the one given as ``transport=`` (e.g. an
    ``InProcessTransport`` in tests; ``cloud`` then defaults to its address).
    """

    def __init__(
        self,
        model: str | Path | Any,
        cloud: str | None = None,
        *,
        config: DeviceConfig | None = None,
        transport: Transport | None = None,
    ) -> None:
        from splitrt.graph import model as graph_mod

        self.config = config or DeviceConfig()
        self.graph = graph_mod.load(model) if isinstance(model, (str, Path)) else model
        self.sha256: str = self.graph.sha256
        self._local = SessionCache(
            self.graph, threads=self.config.intra_op_threads, size=self.config.session_cache_size
        )
        self._remote = Remote(self.graph, cloud, config=self.config, transport=transport)
        self.codec = self._remote.codec
        self.output_names = tuple(t.name for t in self.graph.outputs)

    # -- local ------------------------------------------------------------------------------------
    def run_local(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The whole model on this device (reference, and the last resort)."""
        values, _ = self._local.run_full(self.check_inputs(inputs), list(self.output_names))
        return dict(zip(self.output_names, values, strict=True))

    def run_head(self, inputs: Mapping[str, Any], cut: str, *, checked: bool = False) -> HeadResult:
        """Run the head of ``cut``; the result holds the tensors the tail needs. ``checked``: ``inputs`` are
        ``check_inputs``' arrays that ``diverges`` let through (the runtime checks both once, before it plans)."""
        feeds = dict(inputs) if checked else self.check_inputs(inputs)
        if cut == DEVICE_CUT:  # the whole (original) model: no segments, and no tail afterwards
            values, ms = self._local.run_full(feeds, list(self.output_names))
            return HeadResult(
                cut_id=cut, crossing={}, kept=dict(zip(self.output_names, values, strict=True)), head_ms=ms
            )
        if not checked:
            self._refuse_diverging(feeds, cut)  # a specialised graph, a request of another branch
        cs, env, head_ms = self._local.run_head(cut, feeds)
        return HeadResult(
            cut_id=cut, crossing={n: env[n] for n in cs.tail_inputs}, head_ms=head_ms, kept={n: env[n] for n in cs.kept}
        )

    def finish_locally(self, head: HeadResult) -> SplitResult:
        """Run the tail of ``head.cut_id`` here: the fallback when the cloud cannot. Cut ``device`` has no
        tail: its head already holds the outputs (a 0-node tail would re-check them against the model's
        declarations, which some models get wrong)."""
        if head.cut_id == DEVICE_CUT:
            return SplitResult(
                outputs={n: head.kept[n] for n in self.output_names},
                cut_id=DEVICE_CUT,
                codec="fp32",
                where="local",
                request_id=head.request_id,
                head_ms=head.head_ms,
                total_ms=head.head_ms,
            )
        made, tail_ms = self._local.run_tail(head.cut_id, head.crossing)
        return SplitResult(
            outputs=assemble(self.output_names, head.kept, made),
            cut_id=head.cut_id,
            codec="fp32",
            where="local",
            request_id=head.request_id,
            head_ms=head.head_ms,
            tail_ms=tail_ms,
            total_ms=head.head_ms + tail_ms,
        )

    def warm(self, cut: str) -> None:
        """Build ``cut``'s head and tail sessions now, so switching to it later costs no session build."""
        if cut == DEVICE_CUT:
            self._local.full()
            return
        cs = self._local.cut(cut)
        if cs.head_outputs:
            self._local.head(cs)
        self._local.tail(cs)

    # -- cloud ------------------------------------------------------------------------------------
    @property
    def cloud(self) -> str | None:
        """The cloud's address ("host:port"); set it before the first call to pair a cloud-less Device."""
        return self._remote.cloud

    @cloud.setter
    def cloud(self, address: str | None) -> None:
        self._remote.cloud = address

    @property
    def remote(self) -> Remote:
        """This device's cloud (``device.client.remote``): what every cloud call below goes through."""
        return self._remote

    def _link(self) -> Transport:
        return self._remote.transport()

    def stub(self) -> pb_grpc.SplitInferenceStub:
        """The generated gRPC stub on this device's channel (stock protobuf framing)."""
        return self._remote.stub()

    # The cloud's side of a device: ``Remote``'s methods on the device's remote, signatures and docs included.
    status = _on_remote(Remote.status)
    probe = _on_remote(Remote.probe)
    upload_model = _on_remote(Remote.upload_model)
    ensure_model = _on_remote(Remote.ensure_model)
    upload_in_progress = _on_remote(Remote.upload_in_progress)

    @property
    def _model_checked(self) -> bool:
        # Tests set it to skip the check against servers without Status.
        return self._remote.checked

    @_model_checked.setter
    def _model_checked(self, value: bool) -> None:
        self._remote.checked = value

    def _request(self, head: HeadResult, spec: codec.Codec) -> tuple[wire.Framed, int]:
        return self._remote.request(head, spec)

    def send(self, head: HeadResult, **options: Unpack[SendOptions]) -> SplitResult:
        """``Remote.send``, but a head cut at ``device`` is finished here."""
        if head.cut_id == DEVICE_CUT:
            return self.finish_locally(head)
        return self._remote.send(head, **options)

    def run_detailed(
        self, inputs: Mapping[str, Any], *, cut: str, codec_spec: str | None = None, timeout_s: float | None = None
    ) -> SplitResult:
        if self.diverges(self.check_inputs(inputs)) is not None:
            return self.run_original(inputs)  # another branch than the graph was specialised for
        head = self.run_head(inputs, cut)
        if cut == DEVICE_CUT:
            return self.finish_locally(head)
        return self.send(head, codec_spec=codec_spec, timeout_s=timeout_s)

    def run(
        self, inputs: Mapping[str, Any], *, cut: str, codec_spec: str | None = None, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """Outputs of the model for ``inputs``, split at ``cut`` (``device``: all local)."""
        return self.run_detailed(inputs, cut=cut, codec_spec=codec_spec, timeout_s=timeout_s).outputs

    def stream(
        self, frames: Iterable[Mapping[str, Any]], *, cut: str, codec_spec: str | None = None
    ) -> Iterator[SplitResult]:
        """One result per frame over one bidirectional stream; a failed frame carries ``error``."""
        spec = self.codec if codec_spec is None else codec.Codec.parse(codec_spec)
        self.ensure_model()
        pending: deque[tuple[HeadResult, int, float]] = deque()

        def requests() -> Iterator[wire.Framed]:
            for frame in frames:
                head = self.run_head(frame, cut)
                req, nbytes = self._remote.request(head, spec)
                pending.append((head, nbytes, time.perf_counter()))
                yield req

        for framed in self._link().infer_stream(requests()):
            head, bytes_up, t_sent = pending.popleft()
            yield frame_result(
                framed,
                head,
                cut=cut,
                spec=spec,
                bytes_up=bytes_up,
                t_sent=t_sent,
                decode=functools.partial(self._remote.decode, head=head),
            )

    def close(self) -> None:
        self._remote.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
