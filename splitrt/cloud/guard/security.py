"""Secure by default: ``exposure(config)`` says what a ``ServerConfig`` exposes (``Exposure``), and raises
``ConfigError`` naming the choice to make for a refused one: beyond loopback without TLS and a token and
without ``insecure``; uploads without a token; metrics beyond loopback without ``metrics_public``; a key or
token file others may read. Operators: docs/operator/security.md.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from splitrt.errors import ConfigError

__all__ = ["Exposure", "exposure", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches: 127.0.0.0/8, ::1 and ``localhost``. Any other
    name counts as reachable from the network (it may resolve to anything)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True)
class Exposure:
    host: str
    loopback: bool  # only this machine can connect
    tls: bool
    auth: bool  # bearer tokens required

    @property
    def secure(self) -> bool:
        """TLS and a token: what ``--advertise`` announces as ``secure=1``."""
        return self.tls and self.auth

    @property
    def insecure(self) -> bool:
        """Reachable from the network without both TLS and a token (needs ``insecure=True``)."""
        return not self.loopback and not self.secure

    @property
    def missing(self) -> str:
        """What an off-loopback server lacks, in words ("" when it lacks nothing)."""
        if self.tls and self.auth:
            return ""
        if not self.tls and not self.auth:
            return "neither TLS nor a bearer token"
        return "no TLS" if not self.tls else "no bearer token"

    @property
    def warning(self) -> str:
        """What is insecure, in words; empty when nothing is."""
        if not self.insecure:
            return ""
        risks = [
            r
            for r, on in (
                ("requests travel unencrypted", not self.tls),
                ("anyone who can reach it may use it", not self.auth),
            )
            if on
        ]
        return (
            f"listening on {self.host} (beyond loopback) with {self.missing}: {' and '.join(risks)} "
            "(started with --insecure)"
        )


#: The shortest bearer token a server accepts: a 1-character token is guessed in 95 tries (minutes at the
#: auth throttle's pace). A floor, not advice: make tokens of 16+ random characters.
MIN_TOKEN_CHARS = 8


def exposure(config: Any) -> Exposure:
    """Check a ``ServerConfig``'s security choices; ``ConfigError`` for a refused one (a token shorter
    than ``MIN_TOKEN_CHARS`` included)."""
    short = [t for t in config.tokens if len(t) < MIN_TOKEN_CHARS]
    if short:
        raise ConfigError(
            f"bearer tokens: expected at least {MIN_TOKEN_CHARS} characters each, got {len(short)} shorter "
            f"(the shortest {min(len(t) for t in short)}); make one with `openssl rand -hex 16`"
        )
    exp = Exposure(
        host=config.host,
        loopback=is_loopback(config.host),
        tls=config.tls_cert_path is not None and config.tls_key_path is not None,
        auth=bool(config.tokens),
    )
    if config.allow_upload and not exp.auth:
        raise ConfigError(
            "--allow-upload: expected a bearer token (--token-file) with uploads, got none: "
            "without one anyone who can connect could store models on this server"
        )
    metrics_host = getattr(config, "metrics_host", "127.0.0.1")
    if (
        getattr(config, "metrics_port", None) is not None
        and not is_loopback(metrics_host)
        and not getattr(config, "metrics_public", False)
    ):
        raise ConfigError(
            f"--metrics-host {metrics_host}: serving metrics beyond loopback expected "
            "--metrics-public, got none: the endpoint has no TLS and no token, and tells anyone who "
            "can reach it this server's load, models and errors; scrape it on 127.0.0.1 (the "
            "default) or pass --metrics-public"
        )
    if exp.insecure and not config.insecure:
        raise ConfigError(
            f"--host {config.host}: listening beyond loopback expected TLS (--tls-cert/--tls-key) "
            f"and a bearer token (--token-file), got {exp.missing}; add them, listen on 127.0.0.1 "
            "(the default), or pass --insecure to serve anyone who can reach this address"
        )
    return exp
