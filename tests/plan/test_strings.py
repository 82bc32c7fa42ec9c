"""Plans, chain plans, cut lists, policies and decisions print in a compact form that parses back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import ConfigError, PlanError
from splitrt.graph.cuts import parse_cut_ids
from splitrt.plan.controller import Decision, parse_policy
from splitrt.plan.solver import format_plan, parse_chain_plan, parse_plan

cut_ids = st.one_of(st.just("cloud"), st.just("device"), st.integers(1, 5000).map(lambda i: f"c{i}"))
codecs = st.sampled_from(["fp32", "fp16", "int8", "int8c", "fp16+zlib", "int8c+zlib"])
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@given(cut_ids, codecs)
def test_plan_round_trip(cut: str, codec: str) -> None:
    got_cut, got_codec = parse_plan(format_plan(cut, codec))
    assert got_cut == cut
    assert got_codec == (codec if cut != "device" else "fp32")


@given(cut_ids, cut_ids, codecs)
def test_chain_plan_round_trip(a: str, b: str, codec: str) -> None:
    assert parse_chain_plan(f"{a}>{b}@{codec}") == (a, b, codec)


@given(st.lists(cut_ids, min_size=1, max_size=4))
def test_cut_list_round_trip(ids: list[str]) -> None:
    assert parse_cut_ids(",".join(ids)) == ids


@given(
    st.one_of(
        st.just("adaptive"),
        st.just("route"),
        st.floats(0.01, 100).map(lambda s: f"periodic:{s!r}"),
        st.builds(format_plan, cut_ids, codecs).map(lambda p: f"fixed:{p}"),
    )
)
def test_policy_round_trip(spec: str) -> None:
    kind, arg = parse_policy(spec)
    assert (f"{kind}:{arg}" if arg else kind) == spec


@given(
    st.builds(
        Decision,
        t_s=finite,
        request=text,
        bandwidth_mbps=finite,
        rtt_ms=finite,
        confidence=finite,
        device_load=finite,
        cloud_load=finite,
        cloud_available=st.booleans(),
        previous=st.one_of(st.none(), st.builds(format_plan, cut_ids, codecs)),
        plan=st.builds(format_plan, cut_ids, codecs),
        best=st.builds(format_plan, cut_ids, codecs),
        predicted_ms=finite,
        objective_value=finite,
        switched=st.booleans(),
        reason=text,
        actual_ms=st.one_of(st.none(), finite),
        fallback=st.booleans(),
        server=st.one_of(st.none(), text),
        seq=st.integers(0, 10**9),
        device_ms=finite,
        transfer_ms=finite,
        round_trip_ms=finite,
        cloud_ms=finite,
        download_ms=finite,
        reply_bytes=st.integers(0, 10**12),
        queue_ms=finite,
        extra=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
    )
)
def test_decision_round_trip(d: Decision) -> None:
    line = str(d)
    assert "\n" not in line or "\n" in d.request + d.reason + (d.server or "")
    assert Decision.parse(line) == d
    assert Decision.from_json(d.to_json()) == d


@pytest.mark.parametrize("bad", ["", "c3@", "@fp16", "c3>c9@fp16"])
def test_bad_plan_names_what_was_expected(bad: str) -> None:
    with pytest.raises(PlanError, match="expected a plan like"):
        parse_plan(bad)


def test_bad_decision_line_names_the_form() -> None:
    with pytest.raises(ConfigError, match="expected the form of str"):
        Decision.parse("#x t=1")
