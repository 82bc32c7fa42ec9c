"""Discovery: pure TXT/rank tests anywhere; real zeroconf only between network namespaces (root).

The namespace tests run ``python -m splitrt.cli.discover advertise|browse`` as separate processes in
separate namespaces of one bridged LAN (``splitrt.rig.netns.make_lan``): never on the host's interfaces.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import DiscoveryError
from splitrt.transport.discovery import (
    MODEL_PREFIX_HEX,
    Advertiser,
    Browser,
    ServerInfo,
    decode_secure,
    decode_txt,
    encode_txt,
    rank,
)

REPO = Path(__file__).resolve().parents[2]
SHA_A = hashlib.sha256(b"model a").hexdigest()
SHA_B = hashlib.sha256(b"model b").hexdigest()


# -- pure ---------------------------------------------------------------------------------------

sha256s = st.binary(max_size=8).map(lambda b: hashlib.sha256(b).hexdigest())


@given(st.lists(sha256s, max_size=40, unique=True), st.floats(0.0, 1e6), st.text("0123456789.", max_size=8))
def test_txt_roundtrip(models: list[str], load: float, version: str) -> None:
    txt = encode_txt(version=version, models=models, load=load)
    assert all(len(k) + 1 + len(v) <= 255 for k, v in txt.items())  # one TXT string each
    got_version, got_models, got_load = decode_txt({k.encode(): v.encode() for k, v in txt.items()})
    assert got_version == version
    assert got_models == tuple(m[:MODEL_PREFIX_HEX] for m in models)
    assert got_load == pytest.approx(load, rel=1e-3)


def test_many_models_spill_into_numbered_keys() -> None:
    models = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(30)]
    txt = encode_txt(version="1", models=models, load=1.0)
    assert {"models", "models1", "models2"} <= set(txt)
    assert len(decode_txt(txt)[1]) == 30


def test_decode_tolerates_garbage() -> None:
    version, models, load = decode_txt({b"load": b"lots", b"models": b"xyz,0123456789abcdef", b"x": None})
    assert version == ""
    assert models == ("0123456789abcdef",)
    assert load == math.inf


def test_txt_says_whether_the_server_is_secure() -> None:
    assert encode_txt(version="1", models=[], load=1.0, secure=False)["secure"] == "0"
    assert encode_txt(version="1", models=[], load=1.0, secure=True)["secure"] == "1"
    assert "secure" not in encode_txt(version="1", models=[], load=1.0)
    assert decode_secure({b"secure": b"0"}) is False and decode_secure({"secure": "1"}) is True
    assert decode_secure({b"secure": b"yes"}) is False  # only "1" means secure
    assert decode_secure({b"load": b"1"}) is None  # a server from before the key


def test_encode_rejects_bad_values() -> None:
    with pytest.raises(DiscoveryError, match="sha256"):
        encode_txt(version="1", models=["not-hex"], load=1.0)
    with pytest.raises(DiscoveryError, match="load"):
        encode_txt(version="1", models=[], load=float("nan"))


def server(name: str, load: float = 1.0, models: tuple[str, ...] = ()) -> ServerInfo:
    return ServerInfo(
        name=name,
        host="10.0.0.1",
        port=50051,
        addresses=("10.0.0.1",),
        version="0.1.0",
        models=models,
        load=load,
    )


def test_server_address_and_model_match() -> None:
    s = server("a", models=(SHA_A[:MODEL_PREFIX_HEX],))
    assert s.address == "10.0.0.1:50051"
    assert s.serves(SHA_A) and not s.serves(SHA_B)
    v6 = ServerInfo(name="b", host="fd00::1", port=1, addresses=("fd00::1",), version="", models=(), load=1)
    assert v6.address == "[fd00::1]:1"


def test_rank_by_rtt_and_load() -> None:
    servers = {
        n: server(n, load) for n, load in [("near-busy", 8.0), ("far-idle", 1.0), ("mid", 1.0), ("unprobed", 1.0)]
    }
    rtts = {"near-busy": 2.0, "far-idle": 60.0, "mid": 20.0}
    order = [s.name for s in rank(servers, rtts, tail_ms=10.0)]
    # scores: near-busy 2+80=82, far-idle 60+10=70, mid 20+10=30; unprobed last
    assert order == ["mid", "far-idle", "near-busy", "unprobed"]
    # a fresher load report overrides the TXT one
    assert rank(servers, rtts, {"near-busy": 1.0})[0].name == "near-busy"
    only_a = {"a": server("a", models=(SHA_A[:16],)), "b": server("b", models=(SHA_B[:16],))}
    assert [s.name for s in rank(only_a, {}, model_sha256=SHA_B)] == ["b"]


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=4),
        st.tuples(st.one_of(st.none(), st.floats(0, 1e3)), st.floats(1, 100)),
        max_size=12,
    )
)
def test_rank_is_a_permutation_with_probed_first_and_ordered(spec: dict[str, tuple[Any, float]]) -> None:
    servers = {n: server(n, load) for n, (_, load) in spec.items()}
    rtts = {n: rtt for n, (rtt, _) in spec.items() if rtt is not None}
    order = rank(servers, rtts)
    assert sorted(s.name for s in order) == sorted(servers)
    probed = [s.name in rtts for s in order]
    assert probed == sorted(probed, reverse=True)
    scores = [rtts[s.name] + 10.0 * s.load for s in order if s.name in rtts]
    assert scores == sorted(scores)


def test_advertiser_rejects_bad_arguments_before_touching_the_network() -> None:
    with pytest.raises(DiscoveryError, match="port"):
        Advertiser("x", 0, ["10.0.0.1"])
    with pytest.raises(DiscoveryError, match="addresses"):
        Advertiser("x", 1234, ["not-an-ip"])
    with pytest.raises(DiscoveryError, match="addresses"):
        Advertiser("x", 1234, [])


# -- namespaces (root) ------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces")


class Peer:
    """A ``python -m splitrt.cli.discover`` process in a namespace; collects its JSON stdout lines."""

    def __init__(self, host: Any, *args: str) -> None:
        self.kind = args[0]
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[str] = host.popen(
            [sys.executable, "-m", "splitrt.cli.discover", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(json.loads(line))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float = 15.0, start: int = 0) -> dict[str, Any]:
        """The first line from index ``start`` on that satisfies ``pred``; fails after ``timeout_s``
        (a guard against hanging, not a timing assertion)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    if pred(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    pytest.fail(f"no matching line; got {self.lines}; stderr: {''.join(self.stderr)[-2000:]}")
                self._cond.wait(min(left, 0.5))

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> int:
        if self.proc.poll() is None:
            if self.kind == "browse":
                self.proc.terminate()  # SIGTERM: clean close
            with contextlib.suppress(OSError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()  # advertise: EOF = quit (goodbye packets)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The readers end at EOF; then the pipes are closed here, not left to the garbage collector.
        for t in self._readers:
            t.join(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        return self.proc.returncode


def servers_in(line: dict[str, Any]) -> dict[str, Any] | None:
    return line.get("servers")


def gone(line: dict[str, Any], name: str) -> bool:
    """A browser line whose server set does not contain ``name``."""
    servers = servers_in(line)
    return servers is not None and name not in servers


@pytest.fixture(scope="module")
def lan() -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    from splitrt.rig import netns

    prefix = f"spl-dz{os.getpid() % 1000}"
    netns.cleanup_leftovers(prefix)
    with netns.make_lan(prefix, 3) as the_lan:
        yield the_lan


@contextlib.contextmanager
def peers(*ps: Peer) -> Iterator[tuple[Peer, ...]]:
    try:
        yield ps
    finally:
        for p in ps:
            p.stop()


def advertise(host: Any, name: str, port: int, *extra: str) -> Peer:
    return Peer(
        host,
        "advertise",
        "--name",
        name,
        "--port",
        str(port),
        "--address",
        host.ip,
        "--interface",
        host.ip,
        *extra,
    )


def browse(host: Any, *extra: str) -> Peer:
    return Peer(host, "browse", "--interface", host.ip, *extra)


FIGURES: dict[str, float] = {}


@pytest.mark.root
@needs_root
def test_browser_finds_advertiser_with_address_port_and_txt(lan: Any) -> None:
    h0, h1 = lan.hosts[0], lan.hosts[1]
    with peers(browse(h0), advertise(h1, "cloud-a", 50051, "--model", SHA_A, "--load", "1.5")) as (b, a):
        reg = a.wait(lambda ln: ln.get("event") == "registered")
        line = b.wait(lambda ln: "cloud-a" in (servers_in(ln) or {}))
        FIGURES["register_s"] = reg["register_s"]
        FIGURES["found_after_browser_start_s"] = line["t_s"]
        s = line["servers"]["cloud-a"]
        assert s["host"] == h1.ip
        assert s["port"] == 50051
        assert s["address"] == f"{h1.ip}:50051"
        assert s["models"] == [SHA_A[:MODEL_PREFIX_HEX]]
        assert s["load"] == 1.5
        assert s["version"] == __import__("splitrt").__version__
        assert set(line["servers"]) == {"cloud-a"}
        # the one-shot command lists it too, as JSON and as a table
        argv = [sys.executable, "-m", "splitrt.cli.discover", "discover", "--timeout-s", "1.5"]
        listed = json.loads(h0.run([*argv, "--json", "--interface", h0.ip]).stdout)
        assert listed["cloud-a"]["address"] == f"{h1.ip}:50051"
        table = h0.run([*argv, "--interface", h0.ip]).stdout.splitlines()
        assert table[0].split() == ["name", "address", "version", "load", "models"]
        assert table[1].split()[:2] == ["cloud-a", f"{h1.ip}:50051"]
    assert a.proc.returncode == 0, "".join(a.stderr)
    assert a.lines[-1] == {"event": "closed", "name": "cloud-a"}


@pytest.mark.root
@needs_root
def test_stopping_one_of_two_advertisers_drops_only_it(lan: Any) -> None:
    h0, h1, h2 = lan.hosts
    with peers(browse(h0), advertise(h1, "cloud-b1", 50061), advertise(h2, "cloud-b2", 50062)) as (b, a1, a2):
        both = b.wait(lambda ln: {"cloud-b1", "cloud-b2"} <= set(servers_in(ln) or {}))
        assert both["servers"]["cloud-b2"]["host"] == h2.ip
        n_before = len(b.lines)
        t0 = time.monotonic()
        a1.send("quit")
        assert a1.proc.wait(timeout=10) == 0
        after = b.wait(lambda ln: gone(ln, "cloud-b1"), start=n_before)
        FIGURES["removal_after_goodbye_s"] = time.monotonic() - t0
        assert set(after["servers"]) == {"cloud-b2"}
        assert after["servers"]["cloud-b2"] == both["servers"]["cloud-b2"]
        assert a2.proc.poll() is None


@pytest.mark.root
@needs_root
def test_load_update_is_seen_by_the_browser(lan: Any) -> None:
    h0, h1 = lan.hosts[0], lan.hosts[1]
    with peers(browse(h0), advertise(h1, "cloud-c", 50071, "--load", "1")) as (b, a):
        first = b.wait(lambda ln: "cloud-c" in (servers_in(ln) or {}))
        assert first["servers"]["cloud-c"]["load"] == 1.0
        t0 = time.monotonic()
        n_before = len(b.lines)
        a.send("load 3.25")
        a.wait(lambda ln: ln.get("event") == "updated")
        seen = b.wait(lambda ln: (servers_in(ln) or {}).get("cloud-c", {}).get("load") == 3.25, start=n_before)
        FIGURES["load_update_s"] = time.monotonic() - t0
        assert seen["servers"]["cloud-c"]["port"] == 50071


@pytest.mark.root
@needs_root
def test_crashed_advertiser_is_dropped_after_its_ttl(lan: Any) -> None:
    """No goodbye (SIGKILL): zeroconf alone would keep the PTR >= 1125 s; the browser's recheck drops
    the server once its SRV/TXT/A records (ttl_s) expired and a re-resolve gets no answer."""
    h0, h1, h2 = lan.hosts
    fast = ("--recheck-s", "1", "--resolve-timeout-s", "1")
    with peers(
        browse(h0, *fast),
        advertise(h1, "cloud-d1", 50081, "--ttl-s", "2"),
        advertise(h2, "cloud-d2", 50082, "--ttl-s", "2"),
    ) as (b, a1, _a2):
        b.wait(lambda ln: {"cloud-d1", "cloud-d2"} <= set(servers_in(ln) or {}))
        n_before = len(b.lines)
        t0 = time.monotonic()
        a1.proc.kill()
        after = b.wait(lambda ln: gone(ln, "cloud-d1"), start=n_before, timeout_s=30)
        FIGURES["removal_after_crash_ttl2_s"] = time.monotonic() - t0
        # the live one, whose short-lived records are re-resolved all along, stays
        assert set(after["servers"]) == {"cloud-d2"}
        assert not any(gone(ln, "cloud-d2") for ln in b.lines[n_before:])


@pytest.fixture(scope="module", autouse=True)
def _print_figures() -> Iterator[None]:
    yield
    if FIGURES:
        print("\ndiscovery figures:", json.dumps({k: round(v, 3) for k, v in FIGURES.items()}))


@pytest.mark.root
@needs_root
def test_browser_sees_whether_a_server_is_secure(lan: Any) -> None:
    h0, h1 = lan.hosts[0], lan.hosts[1]
    made: list[Any] = []
    try:
        for name, port, secure in (("open-cloud", 50071, False), ("locked-cloud", 50072, True)):
            made.append(
                h1.call(lambda n=name, p=port, sec=secure: Advertiser(n, p, [h1.ip], interfaces=[h1.ip], secure=sec))
            )
        made.append(h0.call(lambda: Browser(interfaces=[h0.ip])))
        servers = made[-1].wait_for(lambda s: {"open-cloud", "locked-cloud"} <= set(s), timeout_s=20)
        assert servers["open-cloud"].secure is False and servers["locked-cloud"].secure is True
    finally:
        for m in reversed(made):
            m.close()
