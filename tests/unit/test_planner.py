"""Planner: exhaustive, pruned search agrees with brute force; explanation and warnings."""

import pytest

from meshwise.cost.estimate import DEFAULT_HEADROOM, estimate
from meshwise.errors import MeshwiseError
from meshwise.layout import parse, runs_here, validate
from meshwise.plan.planner import (
    RUNNER_UP_POOL,
    TIE,
    _rank_key,
    anything_fits,
    break_ties,
    enumerate_layouts,
    evaluate_layout,
    plan,
    search,
)
from meshwise.spec import ModelSpec, TrainSpec, load_cluster, load_model


@pytest.mark.parametrize("name, gpus, batch", [("llama3-8b", 16, 64), ("tiny", 8, 16), ("llama2-13b", 8, 32)])
def test_pruned_search_equals_brute_force(name, gpus, batch):
    model, cluster = load_model(name), load_cluster("h100" if name != "tiny" else "cpu", gpus)
    train = TrainSpec(batch, min(model.max_seq, 4096), "bf16-mixed")
    layouts = list(enumerate_layouts(model, gpus, batch, runs_here(model, train.seq_len)))
    for lay in layouts:
        validate(lay, model, gpus, batch)  # everything enumerated is valid
    every = [estimate(model, cluster, train, lay) for lay in layouts]
    fitting = [e for e in every if e.fits]
    result = search(model, cluster, train, top=3)
    # the search stops checking memory where no later lower bound can make the top: it counts fits among those checked
    assert result.enumerated == len(layouts) and result.checked <= len(layouts)
    assert result.fitting <= len(fitting) and result.fitting <= result.checked
    whole = search(model, cluster, train, top=len(layouts))  # a top as long as the list: every layout checked
    assert (whole.enumerated, whole.checked, whole.fitting) == (len(layouts), len(layouts), len(fitting))
    brute = sorted(fitting, key=_rank_key)
    usable = cluster.accelerator.memory_bytes * 0.9
    assert result.best[0].layout == break_ties(brute[:RUNNER_UP_POOL], usable)[0].layout
    assert result.best[0].time.step_s <= brute[0].time.step_s * (1 + TIE)  # a tie at worst
    assert all(e.fits for e in result.best)


@pytest.mark.parametrize("name, gpu, gpus, batch", [("tiny-moe", "a100-40gb", 4, 8), ("llama3-8b", "h200", 4, 8)])
def test_pruned_search_keeps_the_whole_pool_of_brute_force(name, gpu, gpus, batch):
    """Every pruning of the search (the memory floors, the fitting tries' shortcuts, the lower
    bounds and their caches) is exact: its pool, the best RUNNER_UP_POOL in order, is brute force's,
    on a mixture of experts (ep) and a memory-bound dense model, both at 16,384 tokens (cp)."""
    model, cluster = load_model(name), load_cluster(gpu, gpus)
    train = TrainSpec(batch, 16384, "bf16-mixed")
    layouts = list(enumerate_layouts(model, gpus, batch, runs_here(model, train.seq_len), seq_len=train.seq_len))
    assert {lay.cp for lay in layouts} == {1, 2} and (not model.moe or {lay.ep for lay in layouts} == {1, 2, 4})
    fitting = [e for e in (estimate(model, cluster, train, lay) for lay in layouts) if e.fits]
    result = search(model, cluster, train, top=3)
    assert result.enumerated == len(layouts) and result.fitting <= min(result.checked, len(fitting))
    assert len(fitting) > RUNNER_UP_POOL
    # enumeration order breaks exact ties of the rank key, as in the search
    brute = [e for _, e in sorted(enumerate(fitting), key=lambda ie: (_rank_key(ie[1]), ie[0]))][:RUNNER_UP_POOL]
    brute = break_ties(brute, cluster.accelerator.memory_bytes * 0.9)
    assert [e.layout for e in result.pool] == [e.layout for e in brute]
    assert [e.time.step_s for e in result.pool] == [e.time.step_s for e in brute]


def test_header_says_when_the_fit_count_covers_only_the_checked_layouts():
    """The header's fit count is exact when every layout's memory was checked, and says "of the N
    checked" when the search stopped early; the JSON carries both counts."""
    from meshwise.plan.planner import Plan

    exact = Plan((), (), (), 1000, 40, checked=1000)
    early = Plan((), (), (), 1000, 40, checked=120)
    assert exact.fit_words() == "1,000 layouts searched, 40 fit"
    assert early.fit_words().startswith("1,000 layouts searched, 40 fit of the 120 checked for memory")
    assert early.as_json()["checked"] == 120 and exact.as_json()["checked"] == 1000
    model, cluster = load_model("llama3-8b"), load_cluster("h100", 64)
    p = plan(model, cluster, TrainSpec(64, 4096, "bf16-mixed"), top=3)
    assert p.checked < p.enumerated and f"of the {p.checked:,} checked" in p.fit_words()


def test_per_micro_batch_reads_ep_only_as_above_one():
    """The search's per-micro-batch tables (PeakCache.table_of) are shared by every ep > 1: the
    activations and buffers of memory._per_micro_batch must not change between ep = 2, 4, ...
    (and do change from ep = 1, so the test can tell)."""
    from dataclasses import replace

    from meshwise.cost.context_parallel import local_train
    from meshwise.cost.memory import _per_micro_batch, rank_shapes

    model, gpus, batch = load_model("tiny-moe"), 8, 16
    train = TrainSpec(batch, 16384, "bf16-mixed")
    layouts = [lay for lay in enumerate_layouts(model, gpus, batch, seq_len=train.seq_len) if lay.ep > 1]
    assert {lay.ep for lay in layouts} == {2, 4} and {lay.cp for lay in layouts} >= {1, 2}
    differs = 0
    for lay in layouts:
        lt, m = local_train(train, lay), lay.accum(batch)
        for shape in rank_shapes(model, lay):
            per_mb = _per_micro_batch(model, lt, lay, shape, m)
            assert per_mb == _per_micro_batch(model, lt, replace(lay, ep=6 - lay.ep), shape, m), lay
            differs += per_mb != _per_micro_batch(model, lt, replace(lay, ep=1), shape, m)
    assert differs


@pytest.mark.parametrize(
    "name, gpu, gpus, batch, seq", [("tiny-moe", "a100-40gb", 8, 16, 16384), ("llama3-8b", "h100", 16, 64, 16384)]
)
def test_peak_cache_memories_are_rank_memories(name, gpu, gpus, batch, seq):
    """The search hands estimate() each rank's memory from its peak cache (PeakCache.memories): for
    every layout, in enumeration order (the tables filling as in a search), it is rank_memories'."""
    from meshwise.cost.estimate import rank_memories
    from meshwise.cost.memory import rank_shapes
    from meshwise.cost.memory_peaks import PeakCache

    model, cluster = load_model(name), load_cluster(gpu, gpus)
    train = TrainSpec(batch, seq, "bf16-mixed")
    peaks = PeakCache(model, train)
    layouts = list(enumerate_layouts(model, gpus, batch, seq_len=seq))
    assert {lay.pp for lay in layouts} > {1} and {lay.cp for lay in layouts} > {1}
    for lay in layouts:
        mems = peaks.memories(lay, rank_shapes(model, lay), cluster.accelerator.memory_bytes)
        assert mems == rank_memories(model, cluster, train, lay), lay


@pytest.mark.parametrize("gpu, cores", [("a100-40gb", 0), ("cpu", 0), ("cpu", 1)])
def test_expert_bound_sits_between_the_compute_bound_and_the_tighter_one(gpu, cores):
    """The search refuses a mixture of experts' layout by lower_bound_experts_s before working out
    the tighter bound: over every layout (ep, cp, pp, ZeRO) it is no less than the compute-only
    bound and no more than the tighter one, in floating point (on CPU ranks sharing cores, where
    the tighter bound is compute plus bubble, too)."""
    from dataclasses import replace

    from meshwise.cost.estimate import lower_bound_compute_s, lower_bound_experts_s, lower_bound_step_s

    model, cluster = load_model("tiny-moe"), load_cluster(gpu, 8)
    if cores:  # two ranks per core
        cluster = replace(cluster, accelerator=replace(cluster.accelerator, cores_per_node=cores))
    train = TrainSpec(16, 16384, "bf16-mixed")
    layouts = list(enumerate_layouts(model, 8, 16, seq_len=train.seq_len))
    assert {lay.ep for lay in layouts} == {1, 2, 4} and {lay.cp for lay in layouts} > {1}
    assert max(lay.pp for lay in layouts) > 1
    above = 0
    for lay in layouts:
        floor = lower_bound_compute_s(model, cluster, train, lay)
        mid = lower_bound_experts_s(model, cluster, train, lay)
        assert floor <= mid <= lower_bound_step_s(model, cluster, train, lay), lay
        above += mid > floor
    assert above if not cores else not above


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16", "fp32"])
def test_memory_never_grows_with_ep_above_one(precision):
    """The search takes what fits a structure at a smaller ep > 1 to fit it at a larger one: every
    rank's peak must not grow with ep from 2 on (every layout of tiny-moe on 8 ranks: cp, pp, ZeRO,
    HSDP). From ep = 1 to 2 it may (the busiest expert rank's capacity factor)."""
    from meshwise.cost.estimate import rank_memories

    model, cluster = load_model("tiny-moe"), load_cluster("a100-40gb", 8)
    train = TrainSpec(16, 16384, precision)
    by_rest: dict[tuple, dict[int, tuple[float, ...]]] = {}
    for lay in enumerate_layouts(model, 8, 16, seq_len=train.seq_len):
        rest = tuple(v for k, v in sorted(lay.__dict__.items()) if k != "ep")
        by_rest.setdefault(rest, {})[lay.ep] = tuple(m.total for m in rank_memories(model, cluster, train, lay))
    compared = 0
    for totals in by_rest.values():
        eps = sorted(e for e in totals if e > 1)
        for small, large in zip(eps, eps[1:]):
            assert all(b <= a for a, b in zip(totals[small], totals[large])), (totals, small, large)
            compared += 1
    assert compared > 100


def test_small_model_gets_ddp():
    model = load_model("llama3-8b")
    p = plan(model, load_cluster("b200", 8), TrainSpec(64, 1024, "bf16"))
    assert p.candidates[0].fits
    assert "fits: data parallelism (DDP)" in p.explanation[0]


def test_memory_wall_explanation_walks_to_what_would_fit():
    p = plan(ModelSpec.from_param_count(70e9), load_cluster("a100-80gb", 1), TrainSpec(512, 2048, "bf16"))
    text = "\n".join(p.explanation)
    assert not p.candidates
    assert "840.0 GB" in text and "does not fit" in text
    assert text.index("1. One device?") < text.index("2. Replicated states?") < text.index("Nothing fits")
    assert "More devices: 16 x a100-80gb" in text  # 840 GB / 16 = 52.5 GB <= 72 GB usable; 8 would need 105 GB


def test_explanation_names_the_runner_up_and_the_binding_constraint():
    p = plan(load_model("llama3-70b"), load_cluster("h100", 64), TrainSpec(512, 4096, "bf16-mixed"), top=3)
    text = "\n".join(p.explanation)
    assert "Chosen:" in text and "(row #1)" in text and "Row #2, " in text
    assert "5. 8 nodes x 8" in text


def test_evaluated_layout_may_not_fit():
    p = evaluate_layout(
        load_model("llama3-70b"), load_cluster("h100", 8), TrainSpec(8, 4096, "bf16-mixed"), parse("dp=8")
    )
    assert len(p.candidates) == 1 and not p.candidates[0].fits
    assert "does NOT fit" in p.explanation[-1]


def test_anti_pattern_warnings():
    model, train = load_model("llama3-70b"), TrainSpec(64, 4096, "bf16-mixed")
    across = evaluate_layout(model, load_cluster("h100", 16, 4), train, parse("tp=8,zero=3", 16))
    assert any("spans nodes" in w for w in across.warnings)
    few = evaluate_layout(
        model, load_cluster("h100", 16, 8), TrainSpec(4, 4096, "bf16-mixed"), parse("tp=8,pp=2,zero=1", 16)
    )
    assert any("micro-batches" in w for w in few.warnings)
    assert any("checkpoint interval" in w for w in few.warnings)
    huge = plan(model, load_cluster("h100", 64), TrainSpec(16384, 4096, "bf16-mixed"), top=1)
    assert any("past the largest published pretraining batch" in w for w in huge.warnings)
    # DeepSeek-V3's own batch (15,360 x 4,096 tokens) is published practice: no warning
    published = plan(model, load_cluster("h100", 64), TrainSpec(15360, 4096, "bf16-mixed"), top=1)
    assert not any("published pretraining batch" in w for w in published.warnings)


def test_batch_that_leaves_no_layout_is_an_error():
    with pytest.raises(MeshwiseError, match="--global-batch"):
        plan(ModelSpec.from_param_count(1e9), load_cluster("cpu", 8), TrainSpec(7, 64))


def test_long_sequence_gets_context_parallelism():
    """128k tokens of Llama 3 70B on 512 H100: without cp nothing fits (one sequence's activations
    overflow a rank even under TP=8+SP and full recompute); the plan uses cp and says why."""
    from meshwise.plan.planner import cp_degrees

    model = load_model("llama3-70b")
    assert cp_degrees(model, 64, 131072) == [1, 2, 4, 8, 16]  # at least CP_MIN_TOKENS per rank
    assert cp_degrees(model, 64, 8192) == [1]
    p = plan(model, load_cluster("h100", 512), TrainSpec(64, 131072, "bf16-mixed"), top=1)
    assert p.candidates[0].fits and p.candidates[0].layout.cp > 1
    step = next(line for line in p.explanation if line.startswith("3b."))
    assert "too long for one rank's activations: context parallelism cp=" in step


def test_tie_explanation_names_only_what_differs():
    """Both recompute (ac=full): the reason is the lower ZeRO stage, never 'no recompute'."""
    from meshwise.layout import Layout
    from meshwise.plan.search import simpler_in

    w = Layout(dp=256, zero=1, shard=256, tp=8, sp=True, pp=8, vpp=8, schedule="interleaved-1f1b", ac="full")
    r = Layout(dp=256, zero=2, shard=256, tp=8, sp=True, pp=8, vpp=8, schedule="interleaved-1f1b", ac="full")
    assert simpler_in(w, r) == "a lower ZeRO stage (1, not 2)"
    assert simpler_in(r, w) is None
    # fewer micro-batches per step, counted (once "fewer ... (mbs x dp = 128, not 64)" read as more)
    fewer = simpler_in(Layout(dp=8, mbs=2), Layout(dp=8, mbs=1), 64)
    assert fewer == "fewer micro-batches per step (4 per replica, not 8)"
    assert simpler_in(Layout(dp=8), Layout(dp=8, ac="full")) == "no recompute"


def test_bubble_remedy_never_predicts_a_larger_bubble():
    """Llama 3 405B on 16,384 H100: the warning read 'the bubble is 10% ... What would
    remove it: schedule=zero-bubble,vpp=2 to 15%'. Each schedule offered now shrinks the bubble, as
    the table's estimate of that layout says."""
    import re

    p = plan(load_model("llama3-405b"), load_cluster("h100", 16384), TrainSpec(2048, 8192, "bf16-mixed"), top=1)
    line = next(w for w in p.warnings if w.startswith("PP="))
    now = float(re.search(r"the bubble is ([\d.]+)% of the step", line).group(1))
    offered = [float(x) for x in re.findall(r"cuts it to ([\d.]+)%", line)]
    assert offered and all(x < now for x in offered), line


def test_a_shorter_sequence_is_the_longest_power_of_two_that_fits():
    """10M tokens of Llama 3 8B on 64 H100: halving gave --seq-len 19531, where
    1,048,576 (split over cp ranks) fits."""
    p = plan(load_model("llama3-8b"), load_cluster("h100", 64), TrainSpec(64, 10_000_000, "bf16-mixed"), top=1)
    assert not p.candidates
    line = next(s for s in p.explanation if "A shorter sequence" in s)
    assert "--seq-len 1048576 " in line
    fits = plan(load_model("llama3-8b"), load_cluster("h100", 64), TrainSpec(64, 1 << 20, "bf16-mixed"), top=1)
    assert fits.candidates and fits.candidates[0].layout.cp > 1


SCREENED = [  # (model, gpu, gpus, train): on both sides of where a layout starts to fit
    ("llama3-8b", "h100", 64, TrainSpec(64, 1 << 21, "bf16-mixed")),
    ("llama3-8b", "h100", 64, TrainSpec(64, 1 << 20, "bf16-mixed")),
    ("llama3-8b", "h100", 8, TrainSpec(8, 1 << 17, "bf16-mixed")),
    ("llama3-8b", "h100", 8, TrainSpec(8, 1 << 16, "bf16-mixed")),
    ("llama3-70b", "h100", 16, TrainSpec(16, 4096, "bf16-mixed", runtime="megatron")),
    ("llama3-70b", "h100", 32, TrainSpec(32, 4096, "bf16-mixed", runtime="megatron")),
    ("70e9", "a100-80gb", 8, TrainSpec(512, 2048, "bf16")),
    ("70e9", "a100-80gb", 16, TrainSpec(512, 2048, "bf16")),
]


@pytest.mark.parametrize("name, gpu, gpus, train", SCREENED)
def test_the_memory_screen_answers_as_the_search(name, gpu, gpus, train):
    """search.anything_fits (what_would_fit's screen, no time bound worked out) says a layout fits
    exactly where the search ranks one."""
    model = ModelSpec.from_param_count(float(name)) if name[0].isdigit() else load_model(name)
    cluster = load_cluster(gpu, gpus)
    assert anything_fits(model, cluster, train) == bool(search(model, cluster, train, top=1).best)


@pytest.mark.parametrize(
    "model, gpus, train",
    [
        (ModelSpec.from_param_count(70e9), 1, TrainSpec(512, 2048, "bf16")),
        (load_model("llama3-8b"), 8, TrainSpec(8, 1 << 17, "fp32")),
    ],
)
def test_what_would_fit_says_what_the_unscreened_searches_say(monkeypatch, model, gpus, train):
    """The screened what_would_fit (a search only where anything_fits) gives the lines of one that
    searches every precision, device count and sequence length it tries."""
    from meshwise.plan import planner

    cluster = load_cluster("h100" if gpus == 8 else "a100-80gb", gpus)
    screened = planner.what_would_fit(model, cluster, train, DEFAULT_HEADROOM)
    monkeypatch.setattr(planner, "anything_fits", lambda *args: True)
    assert screened == planner.what_would_fit(model, cluster, train, DEFAULT_HEADROOM)
    assert len(screened) == (2 if model.states_only else 3)


def test_no_valid_layout_names_a_batch_that_has_one(tmp_path):
    """QA F3: the refusal said "use a multiple of the data-parallel degree (e.g. 3)" without checking.
    Llama 3.2 1B (tied embeddings: no pipeline here) on 3 devices has dp = 3 at every tp and cp, so a
    batch of 2 has no layout; the batch the message names has one, and that layout validates."""
    import json
    import re

    from meshwise.layout import check_runnable

    config = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path))
    assert not list(enumerate_layouts(model, 3, 2, runs_here(model, 4096), seq_len=4096))
    with pytest.raises(MeshwiseError) as err:
        plan(model, load_cluster("h100", 3), TrainSpec(2, 4096, "bf16-mixed"), top=1)
    m = re.fullmatch(
        r"--global-batch: 2 leaves no valid layout on 3 devices \(dp must divide it\); "
        r"--global-batch (\d+) has one \((\S+)\)",
        str(err.value),
    )
    assert m, err.value
    check_runnable(parse(m.group(2)), model, 3, int(m.group(1)), 4096)


def test_cp_past_its_usual_bound_when_nothing_else_is_valid(tmp_path):
    """QA F3: Llama 3.2 1B on 16,384 A100 at batch 512 has no valid layout with cp=1 (dp <= 512 needs
    tp x cp x pp >= 32, tp <= 8, no pp with tied embeddings); the search was refused, while
    dp=512,cp=4,tp=8 runs. Within the usual cp bound nothing is valid; past it, the search plans."""
    import json

    from meshwise.plan.search import cp_degrees

    config = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path))
    assert cp_degrees(model, 16384, 4096) == [1]
    p = plan(model, load_cluster("a100-80gb", 16384), TrainSpec(512, 4096, "bf16-mixed"), top=3)
    assert p.candidates and all(e.fits and e.layout.cp > 1 for e in p.candidates)
    for e in p.candidates:
        validate(e.layout, model, 16384, 512)
