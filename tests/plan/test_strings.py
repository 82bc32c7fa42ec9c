"""Plans, chain plans, cut lists, policies and decisions print in a compact form that parses back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import ConfigError, PlanError
from splitrt.graph.cuts import parse_cut_ids
from splitrt.plan.controller import Decision, parse_policy
from splitrt.plan.path import format_path, parse_path
from splitrt.plan.solver import format_plan, parse_plan

cut_ids = st.one_of(st.just("cloud"), st.just("device"), st.integers(1, 5000).map(lambda i: f"c{i}"))
codecs = st.sampled_from(["fp32", "fp16", "int8", "int8c", "fp16+zlib", "int8c+zlib"])
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@given(cut_ids, codecs)
def test_plan_round_trip(cut: str, codec: str) -> None:
    got_cut, got_codec = parse_plan(format_plan(cut, codec))
    assert got_cut == cut
    assert got_codec == (codec if cut != "device" else "fp32")


@given(st.lists(st.tuples(cut_ids, codecs), min_size=1, max_size=4))
def test_path_plan_round_trip(hops: list[tuple[str, str]]) -> None:
    cuts, ks = [c for c, _ in hops], [k for _, k in hops]
    n = cuts.index("device") + 1 if "device" in cuts else len(cuts)  # nothing goes past `device`
    want = (tuple(cuts[:n]) + ("device",) * (len(cuts) - n), tuple(k if c != "device" else "fp32" for c, k in hops))
    got = parse_path(format_path(cuts, ks), hops=len(cuts))
    assert got[0] == want[0]
    assert got[1][:n] == want[1][:n]


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


@st.composite
def decisions(draw: st.DrawFn) -> Decision:
    """Decisions over 2-4 tiers, every field drawn."""
    hops = draw(st.integers(1, 3))

    def per(n: int, of: st.SearchStrategy[object] = finite) -> tuple[object, ...]:
        return tuple(draw(st.lists(of, min_size=n, max_size=n)))

    plans = st.lists(st.builds(format_plan, cut_ids, codecs), min_size=1, max_size=hops).map(">".join)
    return Decision(
        t_s=draw(finite),
        request=draw(text),
        link_mbps=per(hops),  # type: ignore[arg-type]
        link_rtt_ms=per(hops),  # type: ignore[arg-type]
        link_confidence=per(hops),  # type: ignore[arg-type]
        loads=per(hops + 1),  # type: ignore[arg-type]
        waits_ms=per(hops),  # type: ignore[arg-type]
        up=per(hops, st.booleans()),  # type: ignore[arg-type]
        previous=draw(st.one_of(st.none(), plans)),
        plan=draw(plans),
        best=draw(plans),
        predicted_ms=draw(finite),
        objective_value=draw(finite),
        switched=draw(st.booleans()),
        reason=draw(text),
        route=draw(st.one_of(st.just(()), st.just((0, 2)), st.just((0, 1)))),
        actual_ms=draw(st.one_of(st.none(), finite)),
        fallback=draw(st.booleans()),
        server=draw(st.one_of(st.none(), text)),
        seq=draw(st.integers(0, 10**9)),
        tier_ms=per(draw(st.integers(0, hops + 1))),  # type: ignore[arg-type]
        hop_upload_ms=per(hops),  # type: ignore[arg-type]
        hop_download_ms=per(hops),  # type: ignore[arg-type]
        hop_rtt_ms=per(hops),  # type: ignore[arg-type]
        hop_queue_ms=per(hops),  # type: ignore[arg-type]
        reply_bytes=draw(st.integers(0, 10**12)),
        extra=draw(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3)),
    )


@given(decisions())
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
    with pytest.raises(ConfigError, match="expected the form of str"):
        Decision.parse("#3 c1@fp32 held t=1.0")  # no inputs
