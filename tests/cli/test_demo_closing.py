"""`splitrt demo`'s closing table: every strategy against the oracle, and splitting against routing."""

from __future__ import annotations

import pytest

from splitrt.cli import demo


def test_closing_reports_route_over_split_for_adaptive_and_the_oracle() -> None:
    def s(mean: float) -> dict[str, float]:
        return {"mean_ms": mean, "p95_ms": 2 * mean}

    result = {
        "strategies": {
            "device-only": s(900),
            "cloud-only": s(700),
            "static": s(800),
            "route": s(650),
            "adaptive": s(520),
            "oracle": s(500),
            "oracle-route": s(600),
        }
    }
    c = demo.closing(result)
    assert c["route_over_split"] == {"adaptive": pytest.approx(650 / 520), "oracle": pytest.approx(600 / 500)}
    assert c["adaptive_beats_every_fixed"]
    text = demo.closing_text(c)
    assert "route" in text and "adaptive 1.250, oracle 1.200" in text
    assert "route_over_split" not in demo.closing_text({**c, "route_over_split": {}})


@pytest.mark.slow  # the case plans with the accuracy guard: squeezenet's tails on the photos, once per cache
def test_the_closing_table_shows_a_case_where_splitting_pays_beside_route() -> None:
    """The simulated case (real shipped profile with its guard measured on the photographs, the runtime's
    decision logic): splitting beats routing by >= 10 % there, with an inner cut, beats the router that
    sends a JPEG of the input too, and the closing text says so beside route."""
    pc = demo.pays_case()
    assert pc["route_over_split"] >= 1.10
    assert pc["route_over_split"] == pytest.approx(pc["route"]["mean_ms"] / pc["adaptive"]["mean_ms"])
    assert not pc["adaptive"]["plan"].startswith(("device", "cloud"))
    assert pc["route_codec_over_split"] > 1.0 and pc["route-codec"]["plan"].startswith("cloud@jpeg")
    result = {
        "strategies": {"route": {"mean_ms": 650.0, "p95_ms": 900.0}, "adaptive": {"mean_ms": 520.0, "p95_ms": 800.0}}
    }
    text = demo.closing_text(demo.closing(result, pays=pc))
    assert f"route [{pc['label']}]" in text and f"adaptive [{pc['label']}]" in text
    assert f"route/split {pc['route_over_split']:.3f}" in text


def test_the_closing_compares_adaptive_with_both_routers_over_turns() -> None:
    def s(mean: float) -> dict[str, float]:
        return {"mean_ms": mean, "p95_ms": mean * 1.5}

    turns = {
        "adaptive": [[t, 500.0 + (t % 3), "c9@int8"] for t in range(12)],
        "route": [[t, 560.0 + (t % 3), "cloud@int8"] for t in range(12)],
        "route-codec": [[t, 420.0 + (t % 3), "cloud@jpeg75"] for t in range(12)],
    }
    result = {
        "strategies": {"adaptive": s(501.0), "route": s(561.0), "route-codec": s(421.0)},
        "timeline": {"requests": turns},
        "turns": {"turn_s": 3.0},
    }
    c = demo.closing(result)
    vr = c["vs_routers"]
    assert vr["route"]["call"] == "better" and vr["route"]["ratio"] == pytest.approx(501 / 561)
    assert vr["route-codec"]["call"] == "worse" and vr["route-codec"]["ci"][0] > 1.0
    text = demo.closing_text(c)
    assert "route-codec" in text and "adaptive vs the routers" in text and "worse" in text
