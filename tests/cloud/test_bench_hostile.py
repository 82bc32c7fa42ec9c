"""attacks/attack_hostile.py does not rot: its exfiltration row against a real ``splitrt serve``, with the
shortest phases. The figures belong to the bench; this checks the row runs, is judged, and that nothing
of the server's files came back."""

from __future__ import annotations

from pathlib import Path

from tests.cloud.test_bench_attack import _bench


def test_the_exfil_row_runs_against_a_real_server(tmp_path: Path) -> None:
    b = _bench()
    import attack_hostile  # on sys.path once the bench is loaded

    settings = b.Settings(baseline_s=1.0, attack_s=1.5, blocks=2, recover_cap_s=3.0, drain_s=1.0, quick=True)
    request, cut = b.legit_request()
    row = b.run_row(attack_hostile.Exfil(), settings, set(), request, cut, tmp_path)
    notes = row["notes"]
    assert sum(notes["codes"].values()) > 0 and "OK" not in notes["codes"]  # uploads sent, none stored
    assert notes["stored"] == {} and notes["leaked_replies"] == 0
    names = [n for n, _ in row["targets"]]
    assert "none stored, nothing leaked" in names and "attacker's calls ended" in names
    assert row["sigterm_exit_s"] is not None and row["pass"] == all(ok for _, ok in row["targets"])
