"""What an operator sets on a cloud server: ``ServerConfig`` (its nested ``Limits``, ``UploadPace`` and
``NextTier``), and what follows from it alone: ``tail_threads`` and ``tokens_from_file``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from splitrt.cloud.capacity.memory import DEFAULT_MAX_REQUEST_BYTES
from splitrt.cloud.capacity.niced import DEFAULT_NICE
from splitrt.cloud.guard.limits import Limits
from splitrt.cloud.models.pace import UploadPace
from splitrt.errors import ConfigError
from splitrt.transport import credentials, wire

__all__ = ["NextTier", "ServerConfig", "tail_threads", "tokens_from_file"]


@dataclass(frozen=True, kw_only=True)
class NextTier:
    """Where a server forwards to, and how it treats a next hop that does not answer."""

    address: str
    token: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_ca_path: Path | None = None
    # The forward's timeout is the request's time left minus this reserve (for finishing here), capped.
    reserve_s: float = 0.25
    timeout_s: float = 30.0
    # After a failure, finish requests here without trying the next hop for this long (doubling).
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 5.0


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    models_dir: Path
    # Loopback by default; any other address needs TLS and tokens, or ``insecure=True`` (``security``).
    host: str = "127.0.0.1"
    port: int = 0
    # Accept models uploaded by devices (needs ``tokens``).
    allow_upload: bool = False
    tls_cert_path: Path | None = None
    tls_key_path: Path | None = None
    # Bearer tokens accepted (empty: no auth). ``tokens_from_file`` reads one per line. Never in a repr.
    tokens: tuple[str, ...] = field(default=(), repr=False)
    # The explicit choice to listen beyond loopback without both TLS and tokens (``splitrt serve --insecure``).
    insecure: bool = False
    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    max_queue: int = 32
    segment_cache_size: int = 16
    max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES
    # Cap on the decoded size of one request's input tensors (each and in total); None: 4 x
    # max_message_bytes, what an int8 payload filling a message decodes to as float32.
    max_decoded_bytes: int | None = None
    # Used when the caller set no deadline.
    default_deadline_s: float = 60.0
    drain_timeout_s: float = 10.0
    # Largest model a device may upload (a single-file ONNX model is below 2 GiB: protobuf's limit).
    max_model_bytes: int = 2 * 1024**3
    # The process's memory budget (RSS, ``capacity.memory``); None: none (an in-process server).
    max_memory_bytes: int | None = None
    # A request whose estimated peak activation memory (``graph.peak``) is larger is refused before it runs.
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Store quotas for uploads and the largest graph the server loads (nodes, subgraphs' included).
    max_store_bytes: int = 4 * 1024**3
    max_models: int = 64
    max_nodes: int = 100_000
    # onnxruntime intra-op threads per tail session (0: ``tail_threads``).
    intra_op_threads: int = 0
    # Nice steps below the server's for the runs of a client over its share (``niced``; 0: none).
    over_share_nice: int = DEFAULT_NICE
    # Tail segments made in child processes (``builder``); False: in this process.
    build_in_child: bool = False
    # The next hop on a path of tiers: requests naming ``next_cut_id`` run up to it here and go on there.
    next_tier: NextTier | None = None
    # Prometheus text metrics over HTTP (``GET /metrics``): None = off, 0 = any free port.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # The explicit choice to serve metrics beyond loopback (``splitrt serve --metrics-public``).
    metrics_public: bool = False
    # Time and count limits on what clients hold: lanes, read timeouts, connections (``limits``).
    limits: Limits = field(default_factory=Limits)
    # Warm start (``warm``): remember the pairs served in ``models_dir`` and build them again at start.
    warm_file: bool = False
    # Pairs built at start before the remembered ones: "MODEL@CUT[,CUT...]" (``--warm``).
    warm: tuple[str, ...] = ()
    # Uploads below a minimum rate or past a deadline are cut, their quota freed (``pace``).
    upload_pace: UploadPace = field(default_factory=UploadPace)

    @property
    def decoded_cap_bytes(self) -> int:
        """``max_decoded_bytes``, or 4 x ``max_message_bytes`` (an int8 message decoded as float32)."""
        return 4 * self.max_message_bytes if self.max_decoded_bytes is None else self.max_decoded_bytes

    def check(self) -> None:
        """``ConfigError`` naming the first field out of range (the nested ones' checks included)."""
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ConfigError("TLS needs both a certificate and a key, got only one")
        if self.tls_key_path is not None:  # as token files: a key others can read is no secret
            credentials.check_private(Path(self.tls_key_path), "TLS private key")
        if self.max_model_bytes < 1:
            raise ConfigError(f"max_model_bytes: expected >= 1, got {self.max_model_bytes}")
        if self.intra_op_threads < 0:
            raise ConfigError(f"intra_op_threads: expected >= 0 (0: tail_threads), got {self.intra_op_threads}")
        if self.decoded_cap_bytes < 1:
            raise ConfigError(f"max_decoded_bytes: expected >= 1, got {self.max_decoded_bytes}")
        self.upload_pace.check()


def tail_threads(config: ServerConfig) -> int:
    """onnxruntime threads per tail session: ``intra_op_threads``, or (0) this process's CPUs shared out
    among the workers, at least 1 (onnxruntime's default oversubscribes the host)."""
    if config.intra_op_threads > 0:
        return config.intra_op_threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, config.workers))


def tokens_from_file(path: Path) -> tuple[str, ...]:
    """Bearer tokens, one per line (``#`` comments), from a file only its owner may read (else ``ConfigError``)."""
    return credentials.read_tokens(Path(path), "token file")
