"""An uploaded model is untrusted: its tail's onnxruntime session is opened, and every run of it executes,
on the server's lower-priority threads (``cloud.capacity.niced``), even for a lone client within its share;
the operator's own models open and run at the server's priority. A real server on 127.0.0.1, a real upload
(PutModel) and real onnxruntime sessions; the priority is read on the thread that opens or runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.graph.model import model_sha256
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from tests.cloud.test_hostile import request

TOKEN = "upload-priority-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _neg_chain(n: int) -> bytes:
    names = ["x", *(f"upchain_{i}" for i in range(n - 1)), "y"]  # ``upchain_``: its sessions' mark
    nodes = [helper.make_node("Neg", [names[i]], [names[i + 1]]) for i in range(n)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_an_uploaded_models_session_and_runs_are_at_the_lower_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    own = model_sha256(tmp_path / "tiny_chain.onnx")
    data = _neg_chain(50)
    sha = hashlib.sha256(data).hexdigest()
    opened: list[tuple[str, int]] = []
    real_session = onnxruntime.InferenceSession

    def noting_session(model: Any, *args: Any, **kwargs: Any) -> Any:
        # Whose session (bytes: in-process builds) and the priority of the thread opening it.
        what = "upload" if isinstance(model, bytes) and b"upchain_" in model else "other"
        opened.append((what, _nice()))
        return real_session(model, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", noting_session)
    cfg = ServerConfig(models_dir=tmp_path, workers=2, tokens=(TOKEN,), allow_upload=True)
    runs: list[tuple[str, int]] = []
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        if not s.niced.enabled:
            pytest.skip("the server's lower-priority threads are off here")
        low = s.niced.nice
        run = s.canceller.run

        def noting_run(*args: Any, **kw: Any) -> Any:
            runs.append((str(kw["what"]), _nice()))
            return run(*args, **kw)

        s.canceller.run = noting_run  # type: ignore[method-assign]
        stub = pb_grpc.SplitInferenceStub(ch)
        put = [pb.ModelChunk(sha256=sha, name="chain.onnx", total_bytes=len(data), data=data)]
        assert stub.PutModel(iter(put), timeout=120, metadata=AUTH).sha256 == sha
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        for _ in range(2):  # the first run builds the tail, the second is served from the cache
            stub.Infer(request(own, "cloud", x=x), timeout=60, metadata=AUTH)
            reply = stub.Infer(request(sha, "cloud", x=np.ones(1, np.float32)), timeout=60, metadata=AUTH)
            assert np.frombuffer(reply.outputs[0].payload, np.float32).tolist() == [1.0]  # 50 Negs: x
    base = _nice()
    lowered = min(19, base + low)
    # The arena's seed and the operator's tail at the server's priority, the upload's tail lower.
    assert [n for w, n in opened if w == "upload"] == [lowered], opened
    assert len(opened) >= 2 and all(n == base for w, n in opened if w == "other"), opened
    assert [n for _, n in runs] == [base, lowered, base, lowered], runs
