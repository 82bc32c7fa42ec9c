"""attacks/bench_attack.py does not rot: its cheapest row (token guessing) against a real ``splitrt serve``.
The figures belong to the bench; this checks the row is measured and judged, not how it comes out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

# slow: bench_attack rows against a real server (make test-slow)
pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "attacks" / "bench_attack.py"


def _bench() -> ModuleType:
    if str(BENCH.parent) not in sys.path:  # the script imports attacks/_shared.py as a top-level module
        sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_attack", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_attack"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_the_token_guessing_row_runs_against_a_real_server(tmp_path: Path) -> None:
    b = _bench()
    settings = b.Settings(baseline_s=1.0, attack_s=1.5, blocks=2, recover_cap_s=3.0, drain_s=1.0, quick=True)
    request, cut = b.legit_request()
    row = b.run_row(b.TokenGuess(), settings, set(), request, cut, tmp_path)
    assert row["base_n"] > 0 and row["base_p99_ms"] is not None  # the legit client ran before the attack
    codes = row["notes"]["codes"]
    assert sum(codes.values()) > 0 and "OK" not in codes  # guesses were sent; no wrong token got in
    assert row["sigterm_exit_s"] is not None  # the server was stopped by SIGTERM, not killed
    names = [n for n, _ in row["targets"]]
    assert names[:5] == ["0 legit failures", "p99 <= 3x", "RSS <= budget", "0 lost", "SIGTERM <= drain+5"]
    assert any(n.startswith("guesses/s") for n in names) and any(n.startswith("log <=") for n in names)
    assert row["pass"] == all(ok for _, ok in row["targets"])
    text = b.table([row])
    assert "token_guess" in text and ("PASS" in text or "FAIL" in text)


def test_the_rapid_reset_row_resets_streams_against_a_real_server(tmp_path: Path) -> None:
    b = _bench()
    settings = b.Settings(baseline_s=1.0, attack_s=1.5, blocks=2, recover_cap_s=3.0, drain_s=1.0, quick=True)
    request, cut = b.legit_request()
    row = b.run_row(b.RapidReset(conns=1), settings, set(), request, cut, tmp_path)
    assert row["notes"]["streams_reset"] > 0  # the attack sent HEADERS + RST_STREAM pairs
    assert row["legit_calls"] > 0 and row["sigterm_exit_s"] is not None  # measured; stopped by SIGTERM
    assert row["pass"] == all(ok for _, ok in row["targets"])


def test_the_rapid_reset_row_through_the_edge_proxy_is_cut_there(tmp_path: Path) -> None:
    """``attacks_proxy``: the real HAProxy with deploy/proxy/haproxy.cfg in front, the legit clients through
    it over TLS; the attack's connections are cut or refused by the proxy once over its request rate."""
    import shutil

    import pytest

    if shutil.which("haproxy") is None or shutil.which("openssl") is None:
        pytest.skip("needs the haproxy and openssl binaries (apt-get install -y haproxy)")
    b = _bench()
    import attacks_proxy

    settings = b.Settings(baseline_s=1.0, attack_s=4.0, blocks=2, recover_cap_s=3.0, drain_s=1.0, quick=True)
    request, cut = b.legit_request()
    attack = attacks_proxy.ThroughProxy("rapid_reset_proxy", "rapid reset", 2, attacks_proxy.rapid_reset_batch)
    row = b.run_row(attack, settings, set(), request, cut, tmp_path)
    ended = row["notes"]["connections_ended"]
    # The config cuts an address's connections past 4000 requests in 10 s (every reset stream is one): an
    # attacker that got that far was cut or refused (a slow one on a busy host may not have got that far).
    cut = ended.get("closed", 0) + ended.get("refused", 0) + ended.get("goaway", 0)
    assert row["notes"]["streams"] > 0 and (cut > 0 or row["notes"]["streams"] <= 4100), row["notes"]
    assert row["legit_calls"] > 0 and row["sigterm_exit_s"] is not None
    assert attack.edge is None  # the proxy was stopped with the row


def test_the_stream_row_sends_its_one_head_through_device_stream(tmp_path: Path) -> None:
    b = _bench()
    settings = b.Settings(baseline_s=1.0, attack_s=1.5, blocks=1, recover_cap_s=3.0, drain_s=1.0, quick=True)
    request, cut = b.legit_request()
    row = b.run_row(b.DeviceStream(), settings, set(), request, cut, tmp_path)
    frames = row["notes"]["frames"]
    # The head run once in ``prepare`` is a request the server serves, frame after frame, over both streams.
    assert frames.get("OK", 0) > 2 and set(frames) == {"OK"}, frames
    assert row["legit_calls"] > 0 and row["sigterm_exit_s"] is not None
    assert row["pass"] == all(ok for _, ok in row["targets"])
