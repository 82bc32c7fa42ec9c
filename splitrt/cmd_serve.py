"""`splitrt serve`: the cloud inference server (see splitrt.cloud)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from splitrt import wire
from splitrt.cloud import CloudServer, ServerConfig, tokens_from_file


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the cloud inference server (tails of split models over gRPC)")
    p.add_argument("--models", required=True, type=Path, metavar="DIR",
                   help="directory of .onnx models, served by the sha256 of their bytes")
    p.add_argument("--port", type=int, default=50051, help="TCP port (0: pick a free one; default 50051)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--allow-upload", action="store_true", help="accept models uploaded by devices")
    p.add_argument("--tls-cert", type=Path, metavar="C", help="PEM certificate (with --tls-key): serve TLS")
    p.add_argument("--tls-key", type=Path, metavar="K", help="PEM private key")
    p.add_argument("--token-file", type=Path, metavar="F",
                   help="bearer tokens, one per line: calls without one get UNAUTHENTICATED")
    p.add_argument("--workers", type=int, default=None, help="tails run at once (default: CPU count)")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond the workers")
    p.add_argument("--segment-cache", type=int, default=16, help="tail sessions kept (LRU)")
    p.add_argument("--max-message-mb", type=float, default=wire.DEFAULT_MAX_MESSAGE_BYTES / 2**20,
                   help="gRPC message limit, MiB (default 64)")
    p.add_argument("--drain-s", type=float, default=10.0, help="grace for in-flight calls on SIGTERM/SIGINT")
    p.add_argument("--intra-op-threads", type=int, default=0, help="onnxruntime threads per tail (0: default)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("splitrt.cloud")
    log.addHandler(handler)
    log.setLevel(args.log_level)
    log.propagate = False
    kwargs: dict[str, Any] = {}
    if args.workers is not None:
        kwargs["workers"] = args.workers
    config = ServerConfig(
        models_dir=args.models, host=args.host, port=args.port, allow_upload=args.allow_upload,
        tls_cert_path=args.tls_cert, tls_key_path=args.tls_key,
        tokens=tokens_from_file(args.token_file) if args.token_file else (),
        max_queue=args.max_queue, segment_cache_size=args.segment_cache,
        max_message_bytes=int(args.max_message_mb * 2**20), drain_timeout_s=args.drain_s,
        intra_op_threads=args.intra_op_threads, **kwargs)
    server = CloudServer(config)
    server.start()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0
