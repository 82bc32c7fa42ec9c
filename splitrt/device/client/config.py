"""How a ``Device`` reaches its clouds and runs its sessions (``DeviceConfig``: deadline, codecs, token, TLS,
message limits, uploads, threads), and the token file it reads. ``device.client`` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from splitrt.transport import credentials, wire

__all__ = ["DeviceConfig", "read_token"]


def read_token(path: Path, what: str = "token file") -> str:
    """The bearer token in ``path`` (the first one; ``what`` names the setting in errors). The file must
    be private to its owner, as for the server (``credentials.check_private``)."""
    return credentials.read_tokens(Path(path), what)[0]


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    timeout_s: float = 10.0
    codec: str = "fp32"
    output_codec: str = "fp32"
    # Bearer token sent as 'authorization' metadata.
    token: str | None = field(default=None, repr=False)
    # TLS: on when ``tls`` or a CA file is given; ``tls_server_name`` overrides the name checked.
    tls: bool = False
    tls_ca_path: Path | None = None
    tls_server_name: str | None = None
    max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES
    keepalive_s: float = 30.0
    # Upload the model once if the cloud lacks it and allows uploads.
    upload: bool = True
    upload_chunk_bytes: int = 1024 * 1024
    upload_timeout_s: float = 60.0
    # A failed model check is re-raised without an RPC for this long.
    check_backoff_s: float = 1.0
    intra_op_threads: int = 0
    # Head/tail sessions kept per cut (LRU).
    session_cache_size: int = 8
