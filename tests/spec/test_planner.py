"""The remat planner (jaxremat.spec.planner): optimality against brute force, the unit model, errors."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat.spec import peak_units, segments
from jaxremat.spec.planner import (
    BlockOption, NoPlanFits, PlannerResult, chain_costs, chain_time_s, min_peak_plan, plan_for_budget,
)

MENU_NAMES = ("store", "save_nothing", "save_dots", "attention_only")
POLICY_OF = {"store": None, "save_nothing": "save_nothing", "save_dots": "save_dots",
             "attention_only": "attention_only"}


def _compositions(n):
    for cuts in itertools.product((False, True), repeat=n - 1):
        lengths, run = [], 1
        for cut in cuts:
            if cut:
                lengths.append(run)
                run = 1
            else:
                run += 1
        yield lengths + [run]


def _model_costs(menus, segs, boundary, invariant):
    """The module docstring's formulas, written out independently of the planner's code."""
    merged = []
    for length, o in segs:
        if merged and not menus[0][o].checkpointed and not menus[0][merged[-1][1]].checkpointed:
            merged[-1] = (merged[-1][0] + length, o)
        else:
            merged.append((length, o))
    live, end, below, start, flops = [], invariant, invariant, 0, 0
    for j, (length, o) in enumerate(merged):
        blocks = [menus[i][o] for i in range(start, start + length)]
        ckpt = menus[0][o].checkpointed
        E = (length - 1) * boundary * menus[0][o].keeps_block_input + blocks[0].segment_bytes
        K = sum(b.kept_bytes for b in blocks) + E
        live.append(below + boundary * ckpt + sum(b.working_bytes for b in blocks) + E
                    + max(b.transient_bytes for b in blocks))
        below += boundary + K
        end += K + boundary * ckpt
        flops += sum(b.recompute_flops for b in blocks)
        start += length
    return max(max(live), end), flops


def _brute_force(menus, boundary, invariant, min_checkpoint_length=1):
    """Every cut into contiguous segments, every option per segment: [(peak, recompute, segs)]."""
    n, n_opt = len(menus), len(menus[0])
    out = []
    for lengths in _compositions(n):
        for opts in itertools.product(range(n_opt), repeat=len(lengths)):
            segs = list(zip(lengths, opts))
            if any(menus[0][o].checkpointed and length < min_checkpoint_length for length, o in segs):
                continue
            peak, flops = _model_costs(menus, segs, boundary, invariant)
            out.append((peak, flops, segs))
    return out


@st.composite
def _chains(draw, max_n=8, max_options=3):
    n = draw(st.integers(1, max_n))
    n_opt = draw(st.integers(1, max_options))
    names = MENU_NAMES[:1] + tuple(draw(st.permutations(MENU_NAMES[1:])))[:n_opt - 1]
    if not draw(st.booleans()):  # a menu without the stored option
        names = names[1:] or ("save_nothing",)
    inputs = {name: draw(st.booleans()) for name in names}
    menus = []
    for _ in range(n):
        menu = []
        for name in names:
            if name == "store":
                k = draw(st.integers(0, 40))
                menu.append(BlockOption(name, False, None, k, k, 0, transient_bytes=draw(st.integers(0, 12)),
                                        segment_bytes=draw(st.integers(0, 8))))
            else:
                k = draw(st.integers(0, 20))
                menu.append(BlockOption(name, True, POLICY_OF[name], k, k + draw(st.integers(0, 30)),
                                        draw(st.integers(0, 50)), inputs[name], draw(st.integers(0, 12)),
                                        draw(st.integers(-k, 8))))
        menus.append(menu)
    boundary, invariant = draw(st.integers(0, 15)), draw(st.integers(0, 10))
    return menus, boundary, invariant


@settings(max_examples=60, deadline=None)
@given(_chains(), st.integers(0, 400))
def test_plan_for_budget_equals_brute_force(chain, budget):
    menus, boundary, invariant = chain
    every = _brute_force(menus, boundary, invariant)
    fitting = [(f, p) for p, f, _ in every if p <= budget]
    least_peak = min(p for p, _, _ in every)
    if not fitting:
        with pytest.raises(NoPlanFits) as err:
            plan_for_budget(menus, budget, boundary, invariant)
        assert err.value.min_peak_bytes == least_peak and err.value.budget_bytes == budget
        return
    r = plan_for_budget(menus, budget, boundary, invariant)
    assert r.quantum_bytes == 1 and r.optimal  # small budgets: no rounding, exact
    assert r.recompute_flops == min(f for f, _ in fitting)
    assert r.peak_bytes <= budget and r.min_peak_bytes == least_peak
    # the returned plan's costs, recomputed from the plan itself, are the ones reported
    segs = list(zip([s.length for s in r.plan.segments], r.segment_options))
    assert chain_costs(menus, segs, boundary, invariant) == (r.peak_bytes, r.recompute_flops, r.saved_bytes)
    names = [o.name for o in menus[0]]
    segs = [(length, names.index(name)) for length, name in segs]
    assert _model_costs(menus, segs, boundary, invariant) == (r.peak_bytes, r.recompute_flops)
    assert r.plan.n_layer == len(menus)


@settings(max_examples=40, deadline=None)
@given(_chains(max_n=6), st.integers(0, 400), st.integers(1, 7))
def test_rounded_plan_never_exceeds_budget_and_is_optimal_for_rounded_costs(chain, budget, resolution):
    menus, boundary, invariant = chain
    every = _brute_force(menus, boundary, invariant)
    if min(p for p, _, _ in every) > budget:
        return
    r = plan_for_budget(menus, budget, boundary, invariant, resolution=resolution)
    assert r.peak_bytes <= budget
    assert r.recompute_flops >= min(f for p, f, _ in every if p <= budget)
    if not r.optimal:  # rounding lost every plan: the least-peak plan comes back
        assert r.peak_bytes == r.min_peak_bytes


@settings(max_examples=40, deadline=None)
@given(_chains(max_n=7), st.integers(0, 400), st.integers(2, 4))
def test_min_checkpoint_length_equals_brute_force_over_the_smaller_space(chain, budget, m):
    menus, boundary, invariant = chain
    every = _brute_force(menus, boundary, invariant, m)
    if not every:  # no stored option and a chain too short for one checkpointed segment
        with pytest.raises(ValueError, match="at least"):
            plan_for_budget(menus, budget, boundary, invariant, min_checkpoint_length=m)
        return
    fitting = [f for p, f, _ in every if p <= budget]
    if not fitting:
        with pytest.raises(NoPlanFits) as err:
            plan_for_budget(menus, budget, boundary, invariant, min_checkpoint_length=m)
        assert err.value.min_peak_bytes == min(p for p, _, _ in every)
        assert all(s.length >= m for s in err.value.min_peak_plan.segments if s.checkpointed)
        return
    r = plan_for_budget(menus, budget, boundary, invariant, min_checkpoint_length=m)
    assert r.recompute_flops == min(fitting) and r.peak_bytes <= budget
    assert all(s.length >= m for s in r.plan.segments if s.checkpointed)
    assert min_peak_plan(menus, boundary, invariant, min_checkpoint_length=m)[0] == min(p for p, _, _ in every)


def test_min_checkpoint_length_refuses_bad_values():
    store = BlockOption("store", False, kept_bytes=1, working_bytes=1)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="min_checkpoint_length must be an integer >= 1"):
            plan_for_budget([[store]] * 3, 10, 1, min_checkpoint_length=bad)


def test_min_peak_plan_equals_brute_force_minimum():
    menus = [[BlockOption("store", False, None, 10 + i, 10 + i),
              BlockOption("save_nothing", True, "save_nothing", 0, 10 + i, 5)] for i in range(6)]
    every = _brute_force(menus, 3, 1)
    peak, plan = min_peak_plan(menus, 3, 1)
    assert peak == min(p for p, _, _ in every)
    assert plan.n_layer == 6


def _unit_menu(n, unit=1):
    return [[BlockOption("store", False, None, unit, unit),
             BlockOption("save_nothing", True, "save_nothing", 0, unit, 1)] for _ in range(n)]


@pytest.mark.parametrize("n, s", [(16, 4), (64, 8), (12, 3)])
def test_uniform_checkpointed_chain_reproduces_peak_units(n, s):
    """Unit costs (boundary = one block's bytes): the bytes model is the unit model of cost.py."""
    menu = _unit_menu(n, unit=7)
    peak, flops, _ = chain_costs(menu, [(n // s, "save_nothing")] * s, 7)
    assert peak == 7 * peak_units(n, segments(s)) and flops == n


@pytest.mark.parametrize("n", [16, 36, 64])
def test_unit_chain_least_peak_and_the_sqrt_n_budget(n):
    """Unit costs. Chen et al. 2016: sqrt(N) equal segments peak at 2*sqrt(N) units; unequal
    segments of lengths P-1, P-2, ... do better: the least checkpoint-only peak is the least P
    with P(P-1)/2 >= N units. At the budget 2*sqrt(N) units a store+checkpoint menu recomputes
    fewer than the N blocks segments(sqrt N) recomputes."""
    unit, root = 5, math.isqrt(n)
    ckpt_only = [[BlockOption("save_nothing", True, "save_nothing", 0, unit, 1)] for _ in range(n)]
    least = min(p for p in range(1, n + 2) if p * (p - 1) // 2 >= n)
    assert min_peak_plan(ckpt_only, unit)[0] == least * unit
    budget = 2 * root * unit
    assert chain_costs(ckpt_only, [(root, 0)] * root, unit)[0] == budget == peak_units(n, segments(root)) * unit
    r = plan_for_budget(_unit_menu(n, unit), budget, unit)
    assert r.peak_bytes <= budget and r.recompute_flops < n
    # the store+checkpoint optimum at this budget, by hand: stored blocks sit at the top of the chain
    assert not r.plan.segments[-1].checkpointed


def test_store_and_checkpoint_menu_trades_recompute_for_bytes():
    n, unit = 16, 10
    menu = _unit_menu(n, unit)
    everything = plan_for_budget(menu, (n + 1) * unit, unit)
    assert everything.recompute_flops == 0 and everything.plan.name == "plan(16:store)"
    tight = plan_for_budget(menu, 10 * unit, unit)
    assert 0 < tight.recompute_flops < n and tight.peak_bytes <= 10 * unit
    budgets = [tight.min_peak_bytes + k * unit for k in range(0, 12)]
    flops = [plan_for_budget(menu, b, unit).recompute_flops for b in budgets]
    assert flops == sorted(flops, reverse=True)  # more budget never costs more recompute


def test_docstring_example():
    store = BlockOption("store", False, kept_bytes=100, working_bytes=100)
    ckpt = BlockOption("save_nothing", True, "save_nothing", kept_bytes=0, working_bytes=100, recompute_flops=1e9)
    r = plan_for_budget([[store, ckpt]] * 16, budget_bytes=1000, boundary_bytes=10)
    assert isinstance(r, PlannerResult)
    assert r.recompute_flops == 7e9 and r.peak_bytes == 970
    assert r.plan.name == "plan(1*7+save_nothing,9:store)"


def test_no_plan_fits_names_the_least_peak_and_the_budget():
    menu = _unit_menu(9, 10)
    with pytest.raises(NoPlanFits, match=r"budget of 20 bytes.*smallest predicted peak .* is 50 bytes") as err:
        plan_for_budget(menu, 20, 10)
    assert isinstance(err.value, ValueError)
    assert err.value.min_peak_bytes == 50 and err.value.min_peak_plan.n_layer == 9
    assert chain_costs(menu, [(s.length, "save_nothing" if s.checkpointed else "store")
                              for s in err.value.min_peak_plan.segments], 10)[0] == 50


def test_invariant_bytes_count_in_every_peak():
    menu = _unit_menu(4, 10)
    assert chain_costs(menu, [(4, "store")], 10, 7)[0] == chain_costs(menu, [(4, "store")], 10)[0] + 7
    with pytest.raises(NoPlanFits):
        plan_for_budget(menu, 40, 10, invariant_bytes=1000)


def test_neighbouring_stored_segments_count_as_one():
    menu = _unit_menu(4, 10)
    assert chain_costs(menu, [(2, "store"), (2, "store")], 10) == chain_costs(menu, [(4, "store")], 10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name=""), "non-empty name"),
    (dict(kept_bytes=-1), "kept_bytes must be an integer >= 0"),
    (dict(kept_bytes=1.5), "kept_bytes must be an integer"),
    (dict(kept_bytes=5, working_bytes=2), "working_bytes .* < kept_bytes"),
    (dict(recompute_flops=-1), "recompute_flops must be a finite number >= 0"),
    (dict(recompute_flops=float("nan")), "recompute_flops must be a finite"),
    (dict(policy="no_such_policy"), "no_such_policy"),
    (dict(checkpointed="yes"), "checkpointed must be True or False"),
])
def test_block_option_refuses_bad_values(kwargs, match):
    base = dict(name="ckpt", checkpointed=True, policy=None, kept_bytes=0, working_bytes=10, recompute_flops=1)
    with pytest.raises(ValueError, match=match):
        BlockOption(**{**base, **kwargs})


@pytest.mark.parametrize("kwargs", [dict(policy="save_dots"), dict(recompute_flops=3), dict(working_bytes=11)])
def test_stored_option_keeps_everything_and_recomputes_nothing(kwargs):
    with pytest.raises(ValueError, match="stored option"):
        BlockOption(**{**dict(name="store", checkpointed=False, kept_bytes=10, working_bytes=10), **kwargs})


def test_planner_refuses_bad_menus_and_bytes():
    opt = BlockOption("save_nothing", True, "save_nothing", 0, 10, 1)
    other = BlockOption("save_dots", True, "save_dots", 5, 10, 0)
    with pytest.raises(ValueError, match="non-empty list"):
        plan_for_budget([], 100, 1)
    with pytest.raises(ValueError, match="empty menu"):
        plan_for_budget([[]], 100, 1)
    with pytest.raises(ValueError, match="must be BlockOption"):
        plan_for_budget([["store"]], 100, 1)
    with pytest.raises(ValueError, match="differs from block 0"):
        plan_for_budget([[opt], [other]], 100, 1)
    with pytest.raises(ValueError, match="distinct"):
        plan_for_budget([[opt, opt]], 100, 1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="budget_bytes must be an integer"):
            plan_for_budget([[opt]], bad, 1)
    with pytest.raises(ValueError, match="boundary_bytes"):
        plan_for_budget([[opt]], 100, -3)
    with pytest.raises(ValueError, match="resolution"):
        plan_for_budget([[opt]], 100, 1, resolution=0)
    with pytest.raises(ValueError, match="unknown option"):
        chain_costs([[opt]], [(1, "store")], 1)
    with pytest.raises(ValueError, match="sum to 2 blocks but the chain has 1"):
        chain_costs([[opt]], [(2, 0)], 1)


def test_a_budget_of_exactly_the_stored_peak_stores_everything_whatever_the_rounding():
    menus = [[BlockOption("store", False, None, 1001, 1001),
              BlockOption("save_nothing", True, "save_nothing", 0, 1001, 7)] for _ in range(4)]
    peak = chain_costs(menus, [(4, "store")], 10)[0]
    for resolution in (3, 7, 1000):
        r = plan_for_budget(menus, peak, 10, resolution=resolution)
        assert r.recompute_flops == 0 and r.peak_bytes == peak and r.segment_options == ("store",)


def _merged_time(menus, segs):
    """A plan's time written out: neighbouring stored segments merged, then per block its step time and per
    segment its first block's segment time."""
    merged = []
    for length, o in segs:
        if merged and not menus[0][o].checkpointed and not menus[0][merged[-1][1]].checkpointed:
            merged[-1] = (merged[-1][0] + length, merged[-1][1])
        else:
            merged.append((length, o))
    total, start = 0.0, 0
    for length, o in merged:
        total += menus[start][o].segment_time_s + sum(menus[i][o].step_time_s for i in range(start, start + length))
        start += length
    return total


@settings(max_examples=40, deadline=None)
@given(_chains(max_n=6), st.integers(0, 400), st.data())
def test_time_cost_plan_equals_brute_force_least_time(chain, budget, data):
    menus, boundary, invariant = chain
    # whole numbers of seconds: sums are exact, so the least time is compared with ==
    menus = [[dataclasses.replace(o, step_time_s=data.draw(st.integers(0, 9)),
                                  segment_time_s=data.draw(st.integers(0, 5))) for o in menu] for menu in menus]
    fitting = [(_merged_time(menus, segs), segs) for p, _, segs in _brute_force(menus, boundary, invariant)
               if p <= budget]
    if not fitting:
        return
    r = plan_for_budget(menus, budget, boundary, invariant, cost="time")
    assert r.cost == "time" and r.peak_bytes <= budget
    assert r.step_time_s == min(t for t, _ in fitting)
    segs = list(zip([s.length for s in r.plan.segments], r.segment_options))
    assert chain_time_s(menus, segs) == r.step_time_s
    assert plan_for_budget(menus, budget, boundary, invariant).step_time_s is None  # flops: no time reported


def test_time_cost_trades_flops_for_measured_time():
    """A policy that recomputes fewer FLOPs but runs slower (a dispatch cost per op) wins on flops, loses on time."""
    store = BlockOption("store", False, kept_bytes=100, working_bytes=100, step_time_s=1.0)
    plain = BlockOption("save_nothing", True, "save_nothing", 0, 100, recompute_flops=10.0, step_time_s=1.3)
    dots = BlockOption("save_dots", True, "save_dots", 20, 120, recompute_flops=4.0, step_time_s=1.8)
    menus = [[store, plain, dots]] * 8
    by_flops = plan_for_budget(menus, 500, 10)
    by_time = plan_for_budget(menus, 500, 10, cost="time")
    assert "save_dots" in by_flops.segment_options and set(by_time.segment_options) == {"save_nothing", "store"}
    assert by_time.step_time_s < chain_time_s(menus, list(zip([s.length for s in by_flops.plan.segments],
                                                              by_flops.segment_options)))
    assert by_time.recompute_flops > by_flops.recompute_flops


def test_time_cost_needs_every_option_timed():
    store = BlockOption("store", False, kept_bytes=1, working_bytes=1, step_time_s=1.0)
    plain = BlockOption("save_nothing", True, "save_nothing", 0, 1)
    with pytest.raises(ValueError, match=r"step_time_s; \['save_nothing'\] have none"):
        plan_for_budget([[store, plain]] * 2, 100, 1, cost="time")
    with pytest.raises(ValueError, match="cost must be one of flops, time"):
        plan_for_budget([[store, plain]] * 2, 100, 1, cost="seconds")
    with pytest.raises(ValueError, match="step_time_s must be a finite number >= 0"):
        BlockOption("store", False, kept_bytes=1, working_bytes=1, step_time_s=-1.0)


@pytest.mark.parametrize("text, fraction, nbytes, canonical", [
    ("50%", 0.5, None, "50%"), (" 12MiB ", None, 12 * 2**20, "12MiB"), ("12000000B", None, 12_000_000, "12000000B"),
    ("4kib", None, 4096, "4KiB"), ("0.5KB", None, 500, "0.5KB"),
    # the digits as given, never in exponent form or rounded to 6 digits (each reader parses the text again)
    ("0.0000001%", 1e-9, None, "0.0000001%"), ("1234567.5B", None, 1234567, "1234567.5B"),
    ("2.0000001GiB", None, 2147483755, "2.0000001GiB"), ("+12.50%", 0.125, None, "12.5%"),
])
def test_parse_budget_reads_percentages_and_bytes_with_a_unit(text, fraction, nbytes, canonical):
    from jaxremat.spec.planner import parse_budget

    b = parse_budget(text)
    assert (b.fraction, b.bytes, b.text) == (fraction, nbytes, canonical) and parse_budget(b.text) == b


@pytest.mark.parametrize("text, match", [
    ("12", r"^budget '12' has no unit: write a percentage .* \(50%\) or bytes with a unit \(12MiB, .*12000000B\)"),
    ("0.5", "has no unit"), ("-5", "has no unit"), ("-5%", r"a percentage must lie in \(0%, 100%\]"),
    ("-5MiB", "must be above 0 bytes"), ("0.5B", "under one byte"), ("12XB", "units: B, KB"),
    ("", "write a percentage"), ("99999999999999999999999999GiB", r"past 2\*\*63 - 1 bytes .* write 100%"),
])
def test_parse_budget_refuses_a_bare_number_and_says_to_add_a_unit(text, match):
    from jaxremat.spec.planner import parse_budget

    with pytest.raises(ValueError, match=match):
        parse_budget(text)
