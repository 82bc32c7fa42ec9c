"""`splitrt serve`: the cloud inference server (see splitrt.cloud).

Secure by default (``splitrt.cloud.guard.security``): it listens on 127.0.0.1; any other ``--host`` needs TLS
(``--tls-cert``/``--tls-key``) and ``--token-file``, or an explicit ``--insecure``; ``--allow-upload``
needs ``--token-file``."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from splitrt._signals import stop_on_signals
from splitrt.cloud.capacity.memory import DEFAULT_MAX_MEMORY_BYTES, DEFAULT_MAX_REQUEST_BYTES
from splitrt.cloud.capacity.niced import DEFAULT_NICE
from splitrt.cloud.guard import security
from splitrt.cloud.guard.limits import Limits
from splitrt.cloud.models.pace import UploadPace
from splitrt.cloud.models.warm import WARM_FILE, parse_spec
from splitrt.cloud.server import CloudServer, ServerConfig, tokens_from_file
from splitrt.errors import ConfigError
from splitrt.transport import wire


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the cloud inference server (tails of split models over gRPC)")
    p.add_argument(
        "--models",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory of .onnx models, served by the sha256 of their bytes",
    )
    p.add_argument("--port", type=int, default=50051, help="TCP port (0: pick a free one; default 50051)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; any other address needs "
        "--tls-cert/--tls-key and --token-file, or --insecure)",
    )
    p.add_argument("--allow-upload", action="store_true", help="accept models uploaded by devices (needs --token-file)")
    p.add_argument(
        "--max-model-mb",
        type=float,
        default=ServerConfig.max_model_bytes / 2**20,
        help="largest model a device may upload, MiB (default 2048)",
    )
    p.add_argument("--tls-cert", type=Path, metavar="C", help="PEM certificate (with --tls-key): serve TLS")
    p.add_argument("--tls-key", type=Path, metavar="K", help="PEM private key")
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="F",
        help="bearer tokens, one per line, in a file only its owner can read (chmod 600): calls "
        "without one get UNAUTHENTICATED",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback without TLS and a token: anyone who can reach the address may "
        "use the server, unencrypted (logged as a warning and reported in Status)",
    )
    p.add_argument("--workers", type=int, default=None, help="tails run at once (default: CPU count)")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond the workers")
    p.add_argument(
        "--segment-cache",
        type=int,
        default=16,
        help="tail sessions kept at most (LRU; also bounded in bytes by --max-memory-mb)",
    )
    m = p.add_argument_group("memory and quotas (what a client or an uploaded model can make the server hold)")
    m.add_argument(
        "--max-memory-mb",
        type=float,
        default=DEFAULT_MAX_MEMORY_BYTES / 2**20,
        help="the process's memory budget, MiB: cached sessions and graphs and requests in flight share "
        "what it does not hold at start; beyond it requests get RESOURCE_EXHAUSTED and runs are "
        "terminated (default 1792: the Kubernetes manifest's 2 GiB limit less 1/8; 0: no budget)",
    )
    m.add_argument(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_BYTES / 2**20,
        help="largest peak activation memory of one request, estimated from the graph at its input "
        "shapes before it runs, MiB (default 256)",
    )
    m.add_argument(
        "--max-store-mb",
        type=float,
        default=ServerConfig.max_store_bytes / 2**20,
        help="uploads may fill the models directory up to this, MiB (default 4096)",
    )
    m.add_argument(
        "--upload-min-kbps",
        type=float,
        default=UploadPace.min_rate_bytes_per_s / 1024,
        help="an upload averaging less than this many KiB/s after its first 10 s is cut and its quota freed "
        "(default 32)",
    )
    m.add_argument(
        "--upload-timeout-s",
        type=float,
        default=UploadPace.timeout_s,
        help="an upload still going after this is cut, whatever its own deadline (default 900)",
    )
    m.add_argument(
        "--max-models",
        type=int,
        default=ServerConfig.max_models,
        help="uploads may bring the models directory to this many models (default 64)",
    )
    m.add_argument(
        "--max-nodes",
        type=int,
        default=ServerConfig.max_nodes,
        help="largest graph loaded or uploaded, in nodes, subgraphs included (default 100000)",
    )
    p.add_argument(
        "--max-message-mb",
        type=float,
        default=wire.DEFAULT_MAX_MESSAGE_BYTES / 2**20,
        help="gRPC message limit, MiB (default 64)",
    )
    p.add_argument("--drain-s", type=float, default=10.0, help="grace for in-flight calls on SIGTERM/SIGINT/SIGHUP")
    p.add_argument(
        "--intra-op-threads",
        type=int,
        default=0,
        help="onnxruntime threads per tail (0: the CPUs shared out among the workers, at least 1)",
    )
    p.add_argument(
        "--over-share-nice",
        type=int,
        default=DEFAULT_NICE,
        help=f"nice steps below the server's priority for the runs of a client wanting more than its share of "
        f"the workers while others are active (default {DEFAULT_NICE}; 0: none)",
    )
    p.add_argument(
        "--build-in-process",
        action="store_true",
        help="make tail segments in the server's process, not in a child at nice 10 (slows requests "
        "while a segment is made)",
    )
    w = p.add_argument_group("warm start (tails made at start, in the background)")
    w.add_argument(
        "--warm",
        action="append",
        default=[],
        metavar="MODEL@CUT[,CUT...]",
        help="make these tails at start (repeatable; MODEL a file name in --models or a sha256 prefix), before "
        "the remembered ones; an unknown model or cut is refused at start",
    )
    w.add_argument(
        "--no-warm",
        action="store_true",
        help=f"neither remember the (model, cut) pairs served (in {WARM_FILE} in --models, at most "
        "--segment-cache of them) nor make them again at start. Health says SERVING at once either way: a "
        "warm-up is an optimisation, not a readiness condition (a request for a cut being warmed waits for "
        "that build)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus text metrics on http://HOST:N/metrics (0: any free port; default off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="IP",
        help="address of the metrics endpoint (default 127.0.0.1: this machine only; any other "
        "address needs --metrics-public)",
    )
    p.add_argument(
        "--metrics-public",
        action="store_true",
        help="allow --metrics-host beyond loopback: the metrics (no auth, no TLS) tell anyone who can "
        "reach them the load, models and error counts (logged as a warning)",
    )
    p.add_argument(
        "--default-deadline-s",
        type=float,
        default=ServerConfig.default_deadline_s,
        help="deadline of a call that carries none (default 60)",
    )
    _limit_arguments(p)
    e = p.add_argument_group("edge (three tiers: device -> this server -> next tier)")
    e.add_argument(
        "--next",
        metavar="HOST:PORT",
        default=None,
        help="the next tier: requests naming a second cut run up to it here and go on there "
        "(finished here when it fails)",
    )
    e.add_argument("--next-token-file", type=Path, metavar="F", help="bearer token for the next tier (chmod 600)")
    e.add_argument("--next-tls-ca", type=Path, metavar="CA", help="PEM CA of the next tier: talk TLS to it")
    d = p.add_argument_group("discovery (mDNS _splitrt._tcp; TXT: version, model hashes, load, secure)")
    d.add_argument("--advertise", action="store_true", help="advertise this server on the local network")
    d.add_argument("--advertise-name", metavar="N", help="instance name (default: the host name)")
    d.add_argument(
        "--advertise-address",
        action="append",
        default=[],
        metavar="IP",
        help="address devices connect to (repeatable; default: --host, or every non-loopback IPv4)",
    )
    d.add_argument(
        "--advertise-interface",
        action="append",
        default=[],
        metavar="IP",
        help="bind mDNS to this IP (repeatable; default: all interfaces)",
    )
    d.add_argument("--advertise-ttl-s", type=int, default=120, help="record TTL: how long a crashed server lingers")
    p.set_defaults(func=cmd_serve)


def _limit_flags() -> list[tuple[str, str, Any, Mapping[str, Any]]]:
    """(field, flag, its type, the field's metadata) of every ``Limits`` field that has a flag."""
    hints = typing.get_type_hints(Limits)
    return [
        (f.name, f.metadata["flag"], hints[f.name], f.metadata)
        for f in dataclasses.fields(Limits)
        if "flag" in f.metadata
    ]


def _limit_arguments(p: Any) -> None:
    """The ``Limits`` flags, read from its fields (``cloud.guard.limits.flag``): name, type, default, help."""
    lim = Limits()
    g = p.add_argument_group("limits on what a client may hold (docs/operator/security.md)")
    for name, flag, kind, meta in _limit_flags():
        default = getattr(lim, name)
        if kind is bool:
            g.add_argument(flag, action="store_true", help=meta["help"])
        elif kind == tuple[str, ...]:
            g.add_argument(flag, action="append", default=[], metavar=meta["metavar"], help=meta["help"])
        else:  # int, float, or one of them | None
            base = next(t for t in (typing.get_args(kind) or (kind,)) if t is not type(None))
            shown = default if default is None or meta["scale"] == 1 else default // meta["scale"]
            g.add_argument(flag, type=base, default=shown, metavar=meta["metavar"], help=meta["help"])


def limits_from(args: argparse.Namespace) -> Limits:
    kw: dict[str, Any] = {}
    for name, flag, _, meta in _limit_flags():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if isinstance(value, list):
            value = tuple(value)
        elif meta["scale"] != 1 and value is not None:
            value = value * meta["scale"] or None
        kw[name] = value
    return Limits(**kw)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The ``ServerConfig`` of parsed ``serve`` arguments (reads the token file), checked for its security
    choices (``splitrt.cloud.guard.security``: ``ConfigError`` for an open server nobody asked for)."""
    kwargs: dict[str, Any] = {}
    if args.workers is not None:
        kwargs["workers"] = args.workers
    if getattr(args, "next", None):
        from splitrt.cloud.config import NextTier
        from splitrt.transport.credentials import read_tokens

        token = read_tokens(args.next_token_file, "--next-token-file")[0] if args.next_token_file else None
        kwargs["next_tier"] = NextTier(address=args.next, token=token, tls_ca_path=args.next_tls_ca)
    config = ServerConfig(
        models_dir=args.models,
        host=args.host,
        port=args.port,
        allow_upload=args.allow_upload,
        tls_cert_path=args.tls_cert,
        tls_key_path=args.tls_key,
        tokens=tokens_from_file(args.token_file) if args.token_file else (),
        insecure=args.insecure,
        max_model_bytes=int(args.max_model_mb * 2**20),
        max_queue=args.max_queue,
        segment_cache_size=args.segment_cache,
        max_message_bytes=int(args.max_message_mb * 2**20),
        drain_timeout_s=args.drain_s,
        intra_op_threads=args.intra_op_threads,
        over_share_nice=args.over_share_nice,
        build_in_child=not getattr(args, "build_in_process", False),
        metrics_port=getattr(args, "metrics_port", None),
        metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
        max_memory_bytes=int(args.max_memory_mb * 2**20) or None,
        max_request_bytes=int(args.max_request_mb * 2**20),
        max_store_bytes=int(args.max_store_mb * 2**20),
        upload_pace=UploadPace(
            min_rate_bytes_per_s=getattr(args, "upload_min_kbps", 32.0) * 1024,
            timeout_s=getattr(args, "upload_timeout_s", UploadPace.timeout_s),
        ),
        max_models=args.max_models,
        max_nodes=args.max_nodes,
        metrics_public=getattr(args, "metrics_public", False),
        default_deadline_s=getattr(args, "default_deadline_s", ServerConfig.default_deadline_s),
        limits=limits_from(args) if hasattr(args, "read_timeout_s") else Limits(),
        warm_file=not getattr(args, "no_warm", False),
        warm=tuple(getattr(args, "warm", ())),
        **kwargs,
    )
    config.limits.check()
    config.upload_pace.check()
    for spec in config.warm:  # the syntax now; models and cuts once the store is read (``CloudServer``)
        parse_spec(spec)
    security.exposure(config)
    if getattr(args, "advertise", False) and not args.advertise_address and security.is_loopback(args.host):
        raise ConfigError(
            f"--advertise: expected a server devices can reach (--host IP or 0.0.0.0, or "
            f"--advertise-address for a relay in front of it), got --host {args.host}: only this "
            "machine can connect"
        )
    return config


def cmd_serve(args: argparse.Namespace) -> int:
    config = server_config(args)  # refusals happen here, before anything else
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("splitrt.cloud")
    log.addHandler(handler)
    log.setLevel(args.log_level)
    log.propagate = False
    server = CloudServer(config)
    stop = stop_on_signals()  # before listening: a SIGTERM while starting still stops cleanly
    server.start()
    # What start-up made (modules, sessions, the metrics) is there for good: out of the collector's scans, a
    # full collection looks at the requests' objects only (bench_transport at load 13: -0.07 ms at 100 KB,
    # -0.5 ms at 4 MB). Here only: an in-process server (tests) must not freeze its host's heap.
    gc.freeze()
    advertiser = None
    if args.advertise:
        import socket

        from splitrt.cloud.advertise import ServerAdvertiser

        try:
            advertiser = ServerAdvertiser(
                server,
                name=args.advertise_name or socket.gethostname(),
                addresses=args.advertise_address or None,
                interfaces=args.advertise_interface or None,
                ttl_s=args.advertise_ttl_s,
            )
        except BaseException:
            server.stop(grace_s=0)
            raise
        log.info(
            json.dumps(
                {
                    "event": "advertised",
                    "name": advertiser.name,
                    "addresses": advertiser.addresses,
                    "port": server.port,
                    "secure": advertiser.secure,
                }
            )
        )
    while not stop.wait(0.5):
        pass
    if advertiser is not None:
        advertiser.close()  # goodbye first: devices move on while in-flight calls drain
    server.stop()  # terminates runs still going near the drain's end
    # The drain is over: leave now, whatever still holds a thread (a run stuck inside one kernel ignores its
    # terminate flag; a graph load, a session build or a 64 MiB reply on a slow socket cannot be stopped),
    # instead of the interpreter waiting for those threads at exit.
    if server.busy() or server.admission.admitted:
        log.warning(
            json.dumps(
                {"event": "exit_with_work", "runs": server.canceller.running(), "admitted": server.admission.admitted}
            )
        )
    handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
