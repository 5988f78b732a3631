"""Megatron's search (plan/megatron_search.py): its pruning is exact against brute force."""

import pytest

from meshwise.cost.estimate import estimate
from meshwise.cost.plan_cache import PlanCache
from meshwise.spec import TrainSpec, load_cluster, load_model


@pytest.mark.parametrize("gpu, gpus, seq", [("a100-40gb", 8, 16384), ("h100", 8, 4096)])
def test_megatron_search_keeps_the_whole_pool_of_brute_force(gpu, gpus, seq):
    """plan/megatron_search.py's groups, bounds and lazily built memories drop nothing: its pool of
    RUNNER_UP_POOL equals brute force's over every layout it enumerates (ep folded over tp included),
    and with a top as long as the list its fit count is brute force's."""
    from meshwise.plan.candidates import RUNNER_UP_POOL, _ac_modes, _rank_key, _schedule_ok, break_ties
    from meshwise.plan.megatron_search import _fields, search_megatron

    model, cluster = load_model("tiny-moe"), load_cluster(gpu, gpus)
    train = TrainSpec(16, seq, "bf16-mixed", runtime="megatron")
    layouts = []
    for degrees, mbs_options in _fields(model, gpus, 16, seq):
        base = degrees.layout()
        layouts += [
            degrees.layout(mbs, ac)
            for ac in _ac_modes(model)
            for mbs in mbs_options
            if _schedule_ok(base, 16 // (degrees.dp * mbs))
        ]
    assert any(lay.ep_folds_tp for lay in layouts)
    fitting = [e for e in (estimate(model, cluster, train, lay) for lay in layouts) if e.fits]
    result = search_megatron(PlanCache(model, cluster, train), top=3)
    assert result.enumerated == len(layouts) and result.fitting <= min(result.checked, len(fitting))
    assert len(fitting) > RUNNER_UP_POOL
    whole = search_megatron(
        PlanCache(model, cluster, train), top=len(layouts)
    )  # every layout weighed: the count is exact
    assert (whole.enumerated, whole.checked, whole.fitting) == (len(layouts), len(layouts), len(fitting))
    brute = [e for _, e in sorted(enumerate(fitting), key=lambda ie: (_rank_key(ie[1]), ie[0]))][:RUNNER_UP_POOL]
    brute = break_ties(brute, cluster.accelerator.memory_bytes * 0.9)
    assert [e.layout for e in result.pool] == [e.layout for e in brute]
    assert [e.time.step_s for e in result.pool] == [e.time.step_s for e in brute]


@pytest.mark.parametrize("runtime", ["meshwise", "megatron"])
def test_bound_with_dp_sits_between_the_tighter_bound_and_the_step(runtime):
    """estimate.lower_bound_with_dp_s adds the data-parallel collectives to the tighter bound: over every
    layout of tiny-moe on 8 GPUs it is no less than that bound and no more than the step, in floating
    point, and above the tighter bound somewhere (so the test can tell)."""
    from meshwise.cost.estimate import lower_bound_step_s, lower_bound_with_dp_s
    from meshwise.plan.planner import enumerate_layouts

    model, cluster = load_model("tiny-moe"), load_cluster("h100", 8)
    train = TrainSpec(16, 4096, "bf16-mixed", runtime=runtime)
    above = 0
    for lay in enumerate_layouts(model, 8, 16, seq_len=train.seq_len):
        tight = lower_bound_step_s(model, cluster, train, lay)
        with_dp = lower_bound_with_dp_s(model, cluster, train, lay)
        assert tight <= with_dp <= estimate(model, cluster, train, lay).time.step_s, lay
        above += with_dp > tight
    assert above


def test_stage_memo_tells_folded_ep_apart():
    """Two layouts alike in every field the per-rank memo read before, one with ep folded over tp and one
    not (shard 2 and 4 of dp 8, both HSDP), get their own stage parts: the shared memo gives each the
    estimate it has alone (before, the second took the first's, on DeepSeek-V3 0.67 s for 2.07 s)."""
    from meshwise.layout import parse

    model, cluster = load_model("tiny-moe"), load_cluster("h100", 16)
    train = TrainSpec(64, 4096, "bf16-mixed", runtime="megatron")
    folded, unfolded = (parse(f"dp=8,zero=1,shard={n},ep=4,tp=2", 16) for n in (2, 4))
    assert folded.ep_folds_tp and not unfolded.ep_folds_tp
    alone = [estimate(model, cluster, train, lay).time.step_s for lay in (folded, unfolded)]
    memo: dict = {}
    shared = [estimate(model, cluster, train, lay, stage_cache=memo).time.step_s for lay in (folded, unfolded)]
    assert shared == alone and alone[0] != alone[1]


@pytest.mark.parametrize("runtime", ["meshwise", "megatron"])
def test_other_kind_from_the_plans_search_is_its_own_search(runtime):
    """The explanation's search of the other expert kind (planner._other_ep), answered from the plan's
    own search (of_kind), equals that search run on its own where the explanation reads it: the same
    enumerated count and first layout (its step and memory), for each kind; it weighs no more."""
    from meshwise.cost.plan_cache import PlanCache
    from meshwise.layout import runs_here
    from meshwise.plan.search import search

    model, cluster = load_model("tiny-moe"), load_cluster("h100", 8)
    train = TrainSpec(16, 4096, "bf16-mixed", runtime=runtime)
    for split in (True, False):
        runs = runs_here(model, train.seq_len) if runtime == "meshwise" else (lambda layout: True)

        def other(layout, split=split, runs=runs):
            return (layout.ep == 1) == split and runs(layout)

        alone = search(model, cluster, train, 1, 0.1, where=other)  # no plan cache: a search of its own
        cache = PlanCache(model, cluster, train)
        search(model, cluster, train, 5, 0.1, cache=cache)
        assert cache.search_state.of_kind(split, 1, 0.1) is not None  # answered from the plan's search
        other.ep_split = split
        reused = search(model, cluster, train, 1, 0.1, where=other, cache=cache)
        assert alone.enumerated == reused.enumerated > 0 and reused.checked <= alone.checked
        first, again = alone.best[0], reused.best[0]
        assert (first.layout, first.time.step_s, first.memory.total) == (
            again.layout,
            again.time.step_s,
            again.memory.total,
        )


@pytest.mark.parametrize("runtime", ["meshwise", "megatron"])
def test_lazy_order_falls_back_to_eager_when_a_mode_bounds_below_the_first(runtime, monkeypatch):
    """The searches bound a group's other checkpointing modes only when its first mode's bound comes
    up (plan/bounds.py in_bound_order). Where a mode's bound is below the first's, that order would be
    wrong: the search orders every layout eagerly and answers as before. A bound halved for ac=full
    (still a lower bound) forces it: the pool is the unchanged search's, layout and step."""
    from meshwise.plan import bounds
    from meshwise.plan.search import search

    model, cluster = load_model("tiny-moe"), load_cluster("h100", 8)
    train = TrainSpec(16, 4096, "bf16-mixed", runtime=runtime)
    plain = search(model, cluster, train, 5, 0.1)
    broken = []
    order_s, compute_s = bounds.Bounds.order_s, bounds.Bounds.compute_s

    def halved(real):
        def bound(self, layout):
            return real(self, layout) * (0.5 if layout.ac == "full" else 1.0)

        return bound

    def watch(entries, expand, *at):
        try:
            yield from in_bound_order(entries, expand, *at)
        except bounds.OrderBroken:
            broken.append(True)
            raise

    in_bound_order = bounds.in_bound_order
    monkeypatch.setattr(bounds.Bounds, "order_s", halved(order_s))
    monkeypatch.setattr(bounds.Bounds, "compute_s", halved(compute_s))
    module = "meshwise.plan.megatron_search" if runtime == "megatron" else "meshwise.plan.search"
    monkeypatch.setattr(f"{module}.in_bound_order", watch)
    again = search(model, cluster, train, 5, 0.1)
    assert broken
    assert [e.layout for e in again.pool] == [e.layout for e in plain.pool]
    assert [e.time.step_s for e in again.pool] == [e.time.step_s for e in plain.pool]


@pytest.mark.parametrize("name, batch, seq, bites", [("tiny-moe", 64, 4096, False), ("llama3-8b", 64, 1024, True)])
def test_dp_floor_is_below_every_members_bound_and_bites(name, batch, seq, bites):
    """estimate.lower_bound_dp_floor_s, over the layouts sharing a group, mbs, ac and ZeRO kind, and
    over each layout alone (the search's member floor, its unhidden DP seconds the same at any
    micro-batch count where estimate.dp_reads_m says none is read), is no more than any one's bound
    with the DP collectives plus its optimizer step, and where the DP
    collectives outlast compute (Llama 3 8B, 64k tokens on 64 H100) above the tighter floor (tighter
    bound plus least optimizer step) somewhere: the DP seconds it adds are real. A layout's own floor
    is above its tighter bound plus its optimizer step somewhere in both."""
    from meshwise.cost.estimate import (
        dp_reads_m,
        dp_unhidden_seconds,
        lower_bound_dp_floor_s,
        lower_bound_step_s,
        lower_bound_with_dp_s,
        optimizer_seconds,
        reduces_per_micro_batch,
    )
    from meshwise.cost.memory import rank_shapes
    from meshwise.plan.bounds import compute_key
    from meshwise.plan.candidates import _ac_modes, _schedule_ok
    from meshwise.plan.megatron_search import _fields

    model, cluster = load_model(name), load_cluster("h100", 64)
    train = TrainSpec(batch, seq, "bf16-mixed", runtime="megatron")
    groups: dict[tuple, list] = {}
    for degrees, mbs_options in _fields(model, 64, batch, seq):
        for mbs in mbs_options:
            for ac in _ac_modes(model):
                lay = degrees.layout(mbs, ac)
                if _schedule_ok(lay, lay.accum(batch)):
                    key = (compute_key(lay, model.moe), mbs, ac, reduces_per_micro_batch(lay))
                    groups.setdefault(key, []).append(lay)
    stages: dict = {}
    raised = members_raised = 0
    for members in groups.values():
        shapes = rank_shapes(model, members[0])
        bounds, opts, unhidden = [], [], []
        for lay in members:
            opt_s = optimizer_seconds(model, cluster, train, lay, shapes)
            bounds.append(lower_bound_with_dp_s(model, cluster, train, lay, stages) + opt_s)
            opts.append(opt_s)
            alone = dp_unhidden_seconds(model, cluster, train, lay, shapes, lay.accum(batch))
            unhidden.append([u + opt_s for u in alone])
            # the search's floor of one member (megatron_search _member_floor): below its own bound
            own_s = lower_bound_dp_floor_s(model, cluster, train, lay, (opt_s, unhidden[-1]), stages)
            assert own_s <= bounds[-1], lay
            members_raised += own_s > lower_bound_step_s(model, cluster, train, lay, stages) + opt_s
            if not dp_reads_m(train, lay):  # kept across micro-batch counts: the same at another
                assert dp_unhidden_seconds(model, cluster, train, lay, shapes, 1) == alone, lay
        least = (min(opts), [min(col) for col in zip(*unhidden)])
        floor_s = lower_bound_dp_floor_s(model, cluster, train, members[0], least, stages)
        assert floor_s <= min(bounds)
        raised += floor_s > lower_bound_step_s(model, cluster, train, members[0], stages) + least[0]
    assert len(groups) > 20 and (raised > 0) == bites and members_raised > 0
