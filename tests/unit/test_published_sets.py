"""The published runs' split into a development set and six test sets (src/meshwise/catalog/published_runs.toml):
every run has a set and an origin, an origin never straddles the sets, the held-out sources stay out,
and every run parses and fits its world size; the blind sets' (test2 to test6) validation resolves their
runs and prices none, test3's and test6's figures converted from MFU or TFLOP/s match their sources' own FLOP
count, and test4's to test6's figures are the numbers their source lines quote. Nothing here predicts a run."""

import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity  # noqa: E402
from fidelity import SETS, load_runs, records  # noqa: E402
from meshwise.cost import estimate as estimate_module  # noqa: E402
from meshwise.errors import MeshwiseError  # noqa: E402
from meshwise.layout import runtime_refusal, validate  # noqa: E402
from meshwise.plan import planner  # noqa: E402
from meshwise.plan.band import family  # noqa: E402
from meshwise.spec.cluster import catalog_accelerator  # noqa: E402

HELD_OUT = ("Korthikanti", "MegaScale", "Megatron-LM README", "2407.21783", "Llama 3 (2024) Table 4")


def test_every_run_has_a_set_an_origin_and_a_kind():
    for rec in records():
        assert rec.get("set") in SETS, rec["id"]
        assert rec.get("origin"), rec["id"]
        assert isinstance(rec.get("moe"), bool), rec["id"]


def test_ids_are_unique():
    ids = [rec["id"] for rec in records()]
    assert len(ids) == len(set(ids))


def test_an_origin_is_on_one_side_only():
    sides = defaultdict(set)
    for rec in records():
        sides[rec["origin"]].add(rec["set"])
    straddling = {origin: s for origin, s in sides.items() if len(s) > 1}
    assert not straddling


def test_the_first_39_dense_runs_are_dev():
    """Their handling was chosen while looking at them: they cannot be test data."""
    original = [rec for rec in records() if "precision" not in rec]
    assert len(original) == 39
    assert all(rec["set"] == "dev" and not rec["moe"] for rec in original)


def test_the_test_set_holds_dense_and_moe_runs_of_several_gpus_and_precisions():
    for set_name in SETS:
        new = [rec for rec in records() if rec["set"] == set_name and "precision" in rec]
        assert any(rec["moe"] for rec in new), set_name
        assert any(not rec["moe"] for rec in new), set_name
        assert len({rec["gpu"] for rec in new}) >= 2, set_name
        assert len({rec["precision"] for rec in new}) >= 2, set_name


def test_held_out_sources_stay_out_of_both_sets():
    for rec in records():
        assert not any(name in rec["source"] for name in HELD_OUT), rec["id"]


def test_moe_flag_matches_the_model_and_every_layout_fits():
    for run in load_runs():
        assert run.moe == run.model.moe, run.id
        validate(run.layout, run.model, run.cluster.world_size, run.train.global_batch)
        assert runtime_refusal(run.layout, run.model, run.train.seq_len, run.refusals) is None, run.id


# NeMo's performance summaries of the 25.09 container and later stay out (Megatron-Bridge publishes them).
EXCLUDED_FROM = (25, 9)


def test_nemo_summaries_of_25_09_and_later_stay_out():
    for rec in records():
        text = f"{rec['source']} {rec['origin']}"
        assert "Megatron-Bridge" not in text, rec["id"]
        for yy, mm in re.findall(r"NeMo (\d\d)\.(\d\d)", text):
            assert (int(yy), int(mm)) < EXCLUDED_FROM, rec["id"]


BLIND = ("test2", "test3", "test4", "test5", "test6")  # the sets collected without predicting any of their runs


def _set(name: str) -> list[dict]:
    return [rec for rec in records() if rec["set"] == name]


def _test2() -> list[dict]:
    return _set("test2")


# test3 holds no Blackwell run: no public source with a full Blackwell layout and a figure was found outside
# the excluded summaries and the sources already in the file (docs/fidelity.md, test3's left-out list)
GENERATIONS = {
    "test2": {"ampere", "hopper", "blackwell"},
    "test3": {"ampere", "hopper"},
    "test4": {"ampere", "hopper", "blackwell"},
    "test5": {"ampere", "hopper", "blackwell", "cdna"},  # A100; H200, H800, H100; B200; MI300X
    "test6": {"ampere", "hopper", "blackwell", "cdna"},  # A800; H100, H200; B200, GB200; MI325X
}
# test4 holds 5 MoE runs: the public MoE runs with a full layout and a figure, from sources not already in the file
# and not excluded, that could be read here (docs/fidelity.md, test4's left-out list)
# test5 holds 12: 3 from its first two projects, 9 from the sources added after them
# test6 holds 13 MoE runs from five origins (ms-swift's Megatron-SWIFT benchmark, torchtitan's dsv3_scaling eager row
# and DeepEP README, Megatron-FSDP v2's benchmark, Megatron-LM's DeepSeek-V3 GB200 guide); Megatron-LM's MoE recipes
# were dropped before any evaluation (docs/fidelity.md, test6's left-out list)
MIN_MOE = {"test2": 8, "test3": 8, "test4": 5, "test5": 12, "test6": 13}
# runs and origins of each blind set
MIN_RUNS = {"test2": 20, "test3": 20, "test4": 20, "test5": 20, "test6": 20}
MIN_ORIGINS = {"test2": 4, "test3": 4, "test4": 4, "test5": 4, "test6": 4}


@pytest.mark.parametrize("set_name", BLIND)
def test_blind_sets_span_moe_dense_origins_and_gpu_generations(set_name):
    runs = _set(set_name)
    assert len(runs) >= MIN_RUNS[set_name]
    assert sum(rec["moe"] for rec in runs) >= MIN_MOE[set_name]
    assert len({rec["origin"] for rec in runs}) >= MIN_ORIGINS[set_name]
    assert {family(catalog_accelerator(rec["gpu"])) for rec in runs} >= GENERATIONS[set_name]


@pytest.mark.parametrize("set_name", BLIND)
def test_blind_sets_cite_documents_no_other_set_read(set_name):
    """A whole document on one side: the repository and path (or title) a blind set's run cites, before
    its parenthesis, is cited by no run of another set."""
    others = " ".join(rec["source"] for rec in records() if rec["set"] != set_name)
    for rec in _set(set_name):
        document = rec["source"].split(" (")[0]
        assert len(document) > 20 and document not in others, rec["id"]


@pytest.mark.parametrize("set_name", ("test3", "test4", "test5", "test6"))
@pytest.mark.parametrize("named", HELD_OUT + ("Megatron-Bridge",))
def test_blind_sets_cite_no_excluded_source_even_in_their_assumptions(named, set_name):
    for rec in _set(set_name):
        assert named not in f"{rec['source']} {rec['origin']} {rec['assumed']}", rec["id"]


# mosaicml/llm-foundry scripts/train/benchmarking/README.md (commit 4952183), the NumParams column
MPT_PARAMS = {
    "mpt-1b": 1315950592,
    "mpt-3b": 2651837440,
    "mpt-7b": 6658859008,
    "mpt-13b": 12853954560,
    "mpt-30b": 29975214080,
    "mpt-70b": 64862437376,
}


def test_mpt_models_count_the_parameters_their_benchmark_table_states():
    models = fidelity._models(fidelity._catalog())
    for name, count in MPT_PARAMS.items():
        assert models[name].params == count, name


@pytest.mark.parametrize("set_name", BLIND)
def test_validate_resolves_every_blind_run_and_prices_none(set_name, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("the validation path priced a run")

    for module, name in (
        (fidelity, "estimate"),
        (fidelity, "search"),
        (fidelity, "band_for"),
        (fidelity, "predict"),
        (fidelity.compute, "hardware_flops"),
        (estimate_module, "estimate"),
        (planner, "search"),
    ):
        monkeypatch.setattr(module, name, refuse)
    fidelity.main(["--set", set_name, "--validate"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("ok ") for line in lines) == len(_set(set_name))
    assert not any(line.startswith("FAIL") for line in lines)
    assert "predicted" not in " ".join(lines).replace("nothing predicted", "")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"gpu": "h100-nvl72x"}, "not a catalog accelerator"),
        ({"layout": "dp=8,zero=3,ep=3,mbs=4,ac=full"}, "ep=3"),
        ({"tokens_per_s_per_gpu": 100.0}, "exactly one"),
        ({"step_s": -1.0}, "exactly one"),
        ({"moe": False}, "moe = false"),
        ({"precision": "fp4"}, "precision"),
        ({"set": "holdout"}, "needs set"),
    ],
)
def test_validate_names_what_is_wrong_with_a_run(change, says):
    rec = next(r for r in _test2() if r["id"] == "automodel-h100-qwen3-30b-a3b-8") | change
    with pytest.raises(MeshwiseError, match=says):
        fidelity.check_run(rec, fidelity._models(fidelity._catalog()))


def test_validate_exits_non_zero_on_a_problem(monkeypatch, capsys):
    catalog = fidelity._catalog()
    broken = next(r for r in catalog["run"] if r["set"] == "test2") | {"layout": "dp=3,zero=3,mbs=1"}
    monkeypatch.setattr(fidelity, "_catalog", lambda: catalog | {"run": [broken]})
    with pytest.raises(SystemExit) as stop:
        fidelity.main(["--set", "test2", "--validate"])
    assert stop.value.code == 1
    assert capsys.readouterr().out.startswith(f"FAIL {broken['id']}: ")


def megatron_step_flops(model: dict, global_batch: int, seq: int, tp: int, causal: bool) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py) for a GPT whose every
    MLP is a SwiGLU MoE: B s [12 L h^2 (1 + g/a + s/h) + 18 L h (f k + f_shared) + 6 h V], the vocabulary
    padded to a multiple of 128 x TP; from 2025-03-06 (commit 8873b55) the s/h term is halved (causal)."""
    layers, hidden, heads, groups, ffn, topk, vocab, shared = model.values()
    multiple = 128 * tp
    padded = -(-vocab // multiple) * multiple
    attention = 1 + groups / heads + seq / hidden / (2 if causal else 1)
    per_token = 12 * layers * hidden**2 * attention + 18 * layers * hidden * (ffn * topk + shared) + 6 * hidden * padded
    return global_batch * seq * per_token


# The shapes the conversions use (each run's model table in published_runs.toml), and each converted run's
# published figure as its source prints it: MFU of the paper's 989.5 TFLOP/s peak, or model TFLOP/s per GPU.
SHAPES = {
    "mixtral-8x22b": dict(layers=56, hidden=6144, heads=48, groups=8, ffn=16384, topk=2, vocab=32000, shared=0),
    "mixtral-8x22b-g8t8": dict(layers=56, hidden=6144, heads=48, groups=8, ffn=2048, topk=8, vocab=32000, shared=0),
    "qwen2-57b-a14b": dict(layers=28, hidden=3584, heads=28, groups=4, ffn=2560, topk=8, vocab=151936, shared=20480),
    "llama3-8x70b": dict(layers=80, hidden=8192, heads=64, groups=8, ffn=28672, topk=2, vocab=128256, shared=0),
    "mixtral-8x7b": dict(layers=32, hidden=4096, heads=32, groups=8, ffn=14336, topk=2, vocab=32000, shared=0),
}
CONVERTED = {  # id: (figure as printed, TFLOP/s per GPU, Megatron's causal count)
    "mpf-mixtral-8x22b-h100-128": ("49.3%", 0.493 * 989.5, True),
    "mpf-qwen2-57b-a14b-h100-64": ("39.0%", 0.390 * 989.5, True),
    "mpf-mixtral-8x22b-g8t8-h100-128": ("28.8%", 0.288 * 989.5, True),
    "mpf-llama3-8x70b-h100-256": ("41.6%", 0.416 * 989.5, True),
    "mpf-mixtral-8x22b-h100-128-fp8": ("631.7 TFLOP/s", 631.7, True),
    "mpf-mixtral-8x22b-h100-128-gbs1024": ("52.2%", 0.522 * 989.5, True),
    "mpf-mixtral-8x22b-h100-1024-gbs1024": ("44.9%", 0.449 * 989.5, True),
    "mpf-qwen2-57b-a14b-h100-64-gbs1024": ("39.9%", 0.399 * 989.5, True),
    "mpf-qwen2-57b-a14b-h100-1024-gbs1024": ("33.4%", 0.334 * 989.5, True),
    "mpf-mixtral-8x22b-g8t8-h100-128-gbs1024": ("30.0%", 0.300 * 989.5, True),
    "mpf-mixtral-8x22b-g8t8-h100-1024-gbs1024": ("25.5%", 0.255 * 989.5, True),
    "mcore-moe-readme-mixtral-8x7b-h100-64": ("438 TFLOPS", 438.0, False),
}


def test_test3_converted_figures_match_their_sources_flop_count():
    """Each step time entered from an MFU or TFLOP/s figure is that figure under Megatron-LM's own FLOP
    count at the run's commit, and the figure is the one its source line quotes."""
    runs = {rec["id"]: rec for rec in _set("test3")}
    assert set(CONVERTED) == {
        i
        for i, rec in runs.items()
        if "step_s" in rec and rec["origin"] != "Nemotron-4 15B report (Parmar et al. 2024)"
    }
    for run_id, (printed, tflops, causal) in CONVERTED.items():
        rec = runs[run_id]
        assert printed in rec["source"], run_id
        tp = fidelity.parse(rec["layout"], rec["gpus"]).tp
        flops = megatron_step_flops(SHAPES[rec["model"]], rec["global_batch"], rec["seq_len"], tp, causal)
        assert rec["step_s"] == pytest.approx(flops / (rec["gpus"] * tflops * 1e12), rel=1e-3), run_id


def test_test3_zero_bubble_rows_are_the_papers_samples_per_second():
    """Qi et al.'s samples per GPU per second times the 1024-token sequence, at micro-batch x micro-batches."""
    rows = [rec for rec in _set("test3") if rec["origin"] == "Zero Bubble PP (Qi et al. 2024)"]
    assert len(rows) == 12
    for rec in rows:
        samples = float(re.search(r"micro-batches: ([0-9.]+)\)", rec["source"]).group(1))
        assert rec["tokens_per_s_per_gpu"] == pytest.approx(samples * rec["seq_len"]), rec["id"]
        micro = int(re.search(r"(\d+) micro-batches", rec["source"]).group(1))
        assert rec["global_batch"] == micro * fidelity.parse(rec["layout"], rec["gpus"]).mbs, rec["id"]


def test_zero_bubble_models_count_what_their_names_say():
    """The names count L x 12h^2 plus one 32000 x h matrix (Qi et al., Table 3's shapes)."""
    models = fidelity._models(fidelity._catalog())
    for name in ("1.5b", "6.2b", "14.6b", "28.3b"):
        m = models[f"zb-gpt-{name}"]
        assert round((m.layers * 12 * m.hidden**2 + 32000 * m.hidden) / 1e9, 1) == float(name[:-1]), name


def _printed(value: float) -> set[str]:
    """The ways a source line prints a figure: 21,919 / 21919 / 21919.0 / 641.93 / 24k."""
    forms = {f"{value:g}", f"{value:,.0f}", f"{value:.1f}", f"{value:.2f}"}
    if value >= 1000 and value % 1000 == 0:
        forms.add(f"{value / 1000:g}k")
    return forms


def test_test4_figures_are_the_numbers_their_sources_quote():
    """Every test4 figure is entered as its source prints it (tokens/s per GPU, nothing converted): the
    number stands in the run's source line, and the run's layout multiplies out to its GPU count."""
    runs = _set("test4")
    assert runs
    for rec in runs:
        assert list(rec) and "tokens_per_s_per_gpu" in rec and "step_s" not in rec, rec["id"]
        figure = rec["tokens_per_s_per_gpu"]
        assert any(form in rec["source"] for form in _printed(figure)), rec["id"]
        assert fidelity.parse(rec["layout"], rec["gpus"]).world_size == rec["gpus"], rec["id"]


def test_test4_global_batch_is_the_sources_micro_batches_times_data_parallel():
    """The global batch each test4 run states is micro-batch x data parallel x accumulation, whole."""
    for rec in _set("test4"):
        layout = fidelity.parse(rec["layout"], rec["gpus"])
        per_step = layout.mbs * layout.dp
        assert rec["global_batch"] % per_step == 0, rec["id"]


def test_test5_figures_are_the_numbers_their_sources_quote():
    """Every test5 figure is entered as its source prints it (a step time, or tokens/s per GPU where the source
    gives only that) and agrees with the rest of its source line: KempnerForge's tok/s x step time is the run's
    global batch of 4,096-token sequences (within 1.5%, the rounding of the printed figures); a gpu-recipes log
    entry's consumed samples are its step + 1 global batches; the H800 Megatron tables' Tokens/GPU/Second x
    TimePerIter x GPUs is the global batch's tokens (within 0.5%); InternEvo's GPU Num x Micro Bsz x Micro Num is
    the global batch; fms-fsdp's batch size 2 per GPU is its global batch. Each layout multiplies out to its GPU count."""
    runs = _set("test5")
    assert runs
    for rec in runs:
        figure = rec.get("step_s", rec.get("tokens_per_s_per_gpu"))
        assert figure and any(form in rec["source"] for form in _printed(figure)), rec["id"]
        assert fidelity.parse(rec["layout"], rec["gpus"]).world_size == rec["gpus"], rec["id"]
        step_tokens = rec["global_batch"] * rec["seq_len"]
        if rec["origin"].startswith("KempnerForge"):
            tokens_per_s = float(re.search(r"([0-9,]+) tok/s", rec["source"]).group(1).replace(",", ""))
            assert rec["seq_len"] == 4096, rec["id"]
            assert tokens_per_s * rec["step_s"] == pytest.approx(step_tokens, rel=0.015), rec["id"]
        elif rec["origin"].startswith("gpu-recipes"):
            step = int(re.search(r"step (\d+), consumed samples", rec["source"]).group(1))
            consumed = int(re.search(r"consumed samples (\d+)", rec["source"]).group(1))
            assert consumed == (step + 1) * rec["global_batch"], rec["id"]
        elif rec["origin"].startswith("Megatron MoE on H800"):
            assert f"TimePerIter {rec['step_s']:g} s" in rec["source"], rec["id"]
            assert f"GlobalBatchSize {rec['global_batch']} " in rec["source"], rec["id"]
            tokens_per_s = float(re.search(r"([0-9.]+) Tokens/GPU/Second", rec["source"]).group(1))
            assert tokens_per_s * rec["step_s"] * rec["gpus"] == pytest.approx(step_tokens, rel=0.005), rec["id"]
        else:
            assert "step_s" not in rec and "tokens_per_s_per_gpu" in rec, rec["id"]
        if rec["origin"].startswith("fms-fsdp"):
            assert "Batch Size 2," in rec["source"] and rec["global_batch"] == 2 * rec["gpus"], rec["id"]
        if rec["origin"].startswith("InternEvo"):
            numbers = {
                k: int(re.search(rf"{k} (\d+)", rec["source"]).group(1)) for k in ("GPU Num", "Micro Bsz", "Micro Num")
            }
            assert numbers["GPU Num"] == rec["gpus"] and rec["seq_len"] == 2048, rec["id"]
            assert fidelity.parse(rec["layout"], rec["gpus"]).mbs == numbers["Micro Bsz"], rec["id"]
            assert rec["global_batch"] == numbers["GPU Num"] * numbers["Micro Bsz"] * numbers["Micro Num"], rec["id"]


MLPERF_LOG = re.compile(r"global_batch_size (\d+), gradient_accumulation_steps (\d+), max_sequence_length (\d+)")
MLPERF_CONFIG = re.compile(r"\(TP (\d+), PP (\d+), VP (\d+), CP (\d+), MBS (\d+)\)")


def _check_mlperf(rec: dict) -> None:
    """The log's global batch, accumulation and sequence are the run's (dp x mbs x accumulation = global batch),
    the layout is the config's, and the step is the median training block over the whole steps it holds, or
    the median train_step_time the log reports."""
    layout = fidelity.parse(rec["layout"], rec["gpus"])
    gbs, accum, seq = map(int, MLPERF_LOG.search(rec["source"]).groups())
    assert (gbs, seq) == (rec["global_batch"], rec["seq_len"]), rec["id"]
    assert layout.dp * layout.mbs * accum == gbs, rec["id"]
    config = tuple(map(int, MLPERF_CONFIG.search(rec["source"]).groups()))
    assert (layout.tp, layout.pp, layout.vpp, layout.cp, layout.mbs) == config, rec["id"]
    block = re.search(r"median block ([0-9.]+) s over \d+ blocks of (\d+) tokens", rec["source"])
    if block:
        steps = int(block.group(2)) / (gbs * seq)
        assert steps == int(steps), rec["id"]
        assert rec["step_s"] == pytest.approx(float(block.group(1)) / steps, abs=1e-4), rec["id"]
    else:
        logged = float(re.search(r"median train_step_time ([0-9.]+) s", rec["source"]).group(1))
        assert rec["step_s"] == pytest.approx(logged, abs=1e-4), rec["id"]


def _check_colossalai(rec: dict) -> None:
    """samples/s x sequence / GPUs; the TFLOPS/GPU printed beside it is performance_evaluator.py's count at that
    rate (8 x parameters per token: forward, backward and recomputation) with the model's exact parameters."""
    samples = float(re.search(r"throughput: ([0-9.]+) samples/s", rec["source"]).group(1))
    tflops = float(re.search(r"TFLOPS/GPU: ([0-9.]+)", rec["source"]).group(1))
    tokens_per_gpu = samples * rec["seq_len"] / rec["gpus"]
    assert rec["tokens_per_s_per_gpu"] == pytest.approx(tokens_per_gpu, rel=1e-6), rec["id"]
    params = fidelity.load_model(rec["model"]).params
    assert tflops == pytest.approx(tokens_per_gpu * params * 8 / 1e12, rel=1e-3), rec["id"]
    assert rec["global_batch"] == rec["gpus"] * int(re.search(r"batch_size=(\d+)", rec["source"]).group(1))


def _check_torchtitan_pr(rec: dict) -> None:
    """The printed wps (tokens/s per GPU in train.py of that commit); TP 8 x FSDP 16 with the config's local batch."""
    layout = fidelity.parse(rec["layout"], rec["gpus"])
    assert rec["tokens_per_s_per_gpu"] == float(re.search(r"wps: (\d+)", rec["source"]).group(1)), rec["id"]
    assert "TP=8, FSDP=16" in rec["source"] and (layout.tp, layout.dp) == (8, 16), rec["id"]
    local = int(re.search(r"batch_size (\d+)", rec["source"]).group(1))
    assert layout.mbs == local and rec["global_batch"] == local * layout.dp, rec["id"]


# Megatron-LM's FLOP count for test6's Megatron MoE rows (Megatron-FSDP v2's table, the DeepSeek-V3 GB200 guide); each
# model's shape as Megatron-LM's MoE recipes' ARGS give it, the vocabulary padded as Megatron pads the recipe's tokenizer (to a multiple of
# make_vocab_size_divisible_by x TP: 1187 for Qwen3, 3232 for DeepSeek-V3; the same padded size at TP 1 and 2)
RECIPE_SHAPES = {
    "qwen3-30b-a3b": dict(
        layers=48, hidden=2048, heads=32, groups=4, kv_channels=128, moe_ffn=768, topk=8, vocab=151936
    ),
    "qwen3-235b-a22b": dict(
        layers=94, hidden=4096, heads=64, groups=4, kv_channels=128, moe_ffn=1536, topk=8, vocab=151936
    ),
    "deepseek-v3": dict(
        layers=61,
        hidden=7168,
        heads=128,
        moe_ffn=2048,
        topk=8,
        vocab=129280,
        dense=3,
        ffn=18432,
        shared=2048,
        mtp=1,
        q_lora=1536,
        kv_lora=512,
        qk=128,
        rope=64,
        v=128,
    ),
}


def megatron_recipe_flops(shape: dict, global_batch: int, seq: int) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, transformer_flops, at the MoE
    recipes README's commit 9c5258f): 6 x tokens x [h (3 f dense + 3 f_e k moe + 3 f_s moe) + attention's projections
    per layer (MLA or GQA) + MTP norms and projection + h V (mtp + 1)] + 6 x B s^2 x attention's core per layer
    (causal: halved), the MTP layers counted as MoE layers with their own attention."""
    get = lambda key: shape.get(key, 0)  # noqa: E731
    h, heads, mtp = shape["hidden"], shape["heads"], get("mtp")
    dense, layers = get("dense"), shape["layers"] + mtp
    moe = layers - dense
    if "q_lora" in shape:
        q_term = get("q_lora") * (h + heads * (get("qk") + get("rope")) + 1)
        kv_term = get("kv_lora") * (h + heads * (get("qk") + get("v")) + 1) + h * get("rope")
        projections = q_term + kv_term + heads * get("v") * h
        core = heads * (get("qk") + get("rope")) / 2 + heads * get("v") / 2
    else:
        query, key = get("kv_channels") * heads, get("kv_channels") * get("groups")
        projections, core = h * (query + 2 * key) + query * h, query
    mlp = h * 3 * (get("ffn") * dense + (shape["moe_ffn"] * shape["topk"] + get("shared")) * moe)
    per_token = mlp + projections * layers + mtp * (3 * h + 2 * h * h) + h * shape["vocab"] * (mtp + 1)
    return 6 * global_batch * seq * (per_token + seq * core * layers)


def _check_megatron_swift_row(rec: dict, layout) -> None:
    """A Megatron-SWIFT benchmark row: its s/it stands in the doc's table and in its script's comment, and the script's
    GPU count, parallel degrees, batch and packed length are the run's (packing: one max_length sequence per sample)."""
    source = rec["source"]
    assert source.count(f"{rec['step_s']:g}s/it") >= 2, rec["id"]
    assert f"NPROC_PER_NODE={rec['gpus']}," in source and f"eight {rec['gpu'].upper()} GPUs" in source, rec["id"]
    flags = {
        "pipeline_model_parallel_size": layout.pp,
        "expert_model_parallel_size": layout.ep,
        "micro_batch_size": layout.mbs,
        "global_batch_size": rec["global_batch"],
        "max_length": rec["seq_len"],
    }
    for flag, value in flags.items():
        assert f"{flag} {value}," in source or source.endswith(f"{flag} {value}"), (rec["id"], flag)
    assert "tensor_model_parallel_size" not in source and layout.tp == 1 and "packing true" in source, rec["id"]
    assert rec["global_batch"] % (layout.dp * layout.mbs) == 0 and rec["moe"], rec["id"]


def _check_titan_dsv3_scaling_row(rec: dict, layout) -> None:
    """A torchtitan dsv3_scaling eager row: its tokens/s per GPU is the mean of the logged values the source line lists
    (within 1 token/s, the printed rounding), its launcher's degrees and batch are the run's, the step those tokens give
    is the profiler-free step the same log states (within 1%), and the model counts the parameters its log prints."""
    source = rec["source"]
    logged = [float(v.replace(",", "")) for v in re.findall(r"(?:20|30|40|50) \| ([0-9,]+)", source)]
    assert len(logged) == 4 and abs(sum(logged) / 4 - rec["tokens_per_s_per_gpu"]) <= 1.0, rec["id"]
    assert f"eager tps {rec['tokens_per_s_per_gpu']:,.0f}" in source, rec["id"]
    degrees = {"data_parallel_shard_degree": layout.dp, "tensor_parallel_degree": layout.tp}
    degrees |= {"expert_parallel_degree": layout.ep, "NGPU": rec["gpus"]}
    for flag, value in degrees.items():
        assert f"{flag}={value}," in source, (rec["id"], flag)
    assert f"local_batch_size {layout.mbs}" in source and rec["global_batch"] == layout.mbs * layout.dp, rec["id"]
    assert f"seq_len {rec['seq_len']}" in source and "activation_checkpoint.mode full" in source, rec["id"]
    step_s = rec["global_batch"] * rec["seq_len"] / (rec["gpus"] * rec["tokens_per_s_per_gpu"])
    stated = float(re.search(r"-> ([0-9.]+) s", source).group(1))
    assert step_s == pytest.approx(stated, rel=0.01), rec["id"]
    params = int(re.search(r"([0-9,]+) total params", source).group(1).replace(",", ""))
    assert fidelity._models(fidelity._catalog())[rec["model"]].params == params, rec["id"]


def _check_titan_deepep_readme_row(rec: dict, layout) -> None:
    """A torchtitan DeepEP README row: its tokens/s per GPU stands in the table row (or the opening sentence) its source
    line quotes, with that row's nodes of 8 and GPU count, its local batch (the config's 8, or the weak-scaling row's LBS)
    times the GPUs as the global batch, FSDP over every GPU with the config's EP; every table row's TFLOPS over tokens/s is
    one model's FLOPs per token (within 0.5% of the others: the same model and sequence)."""
    source, figure = rec["source"], f"{rec['tokens_per_s_per_gpu']:,.0f}"
    assert "expert_parallel_degree = 8" in source and "seq_len = 4096" in source and layout.ep == 8, rec["id"]
    assert layout.dp == rec["gpus"] and rec["seq_len"] == 4096, rec["id"]
    row = re.search(r"\| (\d+)(?: nodes?)? \| (\d+) \| (\d+) \| ([0-9,]+) \| (\d+) \|", source)
    if row is None:  # the default-EP figure of the opening sentence, on one node
        assert f"14,796 vs {figure} tok/s/GPU at EP=8" in source and rec["gpus"] == 8, rec["id"]
        assert layout.mbs == 8 and rec["global_batch"] == 8 * rec["gpus"], rec["id"]
        assert rec.get("moe_dispatcher") == "all-to-all", rec["id"]
        return
    first, second, gpus, tps, tflops = row.groups()
    lbs, nodes = (int(first), int(second)) if "Weak Scaling" in source else (8, int(first))
    assert nodes == int(second) and nodes * 8 == int(gpus) == rec["gpus"] and tps == figure, rec["id"]
    assert layout.mbs == lbs and rec["global_batch"] == lbs * rec["gpus"], rec["id"]
    assert float(tflops) * 1e12 / float(tps.replace(",", "")) == pytest.approx(23.04e9, rel=0.005), rec["id"]


def _check_megatron_fsdp_row(rec: dict, layout) -> None:
    """A Megatron-FSDP v2 benchmark row: the step is the global batch over the table's Samples/s (within 0.01%), the
    script's GPUs, degrees and batch are the run's, and the table's median TFLOP/s/GPU over that step is Megatron-LM's own
    FLOP count of the batch (within 2%: the median and the samples rate are two statistics of one run)."""
    source = rec["source"]
    backend, tflops, samples_per_s = re.search(
        r"\| (Megatron-FSDP v2[^|]*) \| ([0-9.]+) \| ([0-9.]+) \|", source
    ).groups()
    assert rec["step_s"] == pytest.approx(rec["global_batch"] / float(samples_per_s), rel=1e-4), rec["id"]
    assert ("MXFP8" in backend) == (rec["precision"] == "mxfp8"), rec["id"]
    nodes, per_node = (int(re.search(rf"--{k}=(\d+)", source).group(1)) for k in ("nodes", "ntasks-per-node"))
    assert nodes * per_node == rec["gpus"] == layout.dp and layout.tp == layout.pp == 1, rec["id"]
    flags = {"micro-batch-size": layout.mbs, "expert-model-parallel-size": layout.ep}
    flags |= {"global-batch-size": rec["global_batch"], "seq-length": rec["seq_len"]}
    for flag, value in flags.items():
        assert f"--{flag} {value}," in source, (rec["id"], flag)
    flops = megatron_recipe_flops(RECIPE_SHAPES[rec["model"]], rec["global_batch"], rec["seq_len"])
    assert float(tflops) * 1e12 * rec["gpus"] * rec["step_s"] == pytest.approx(flops, rel=0.02), rec["id"]


def _check_dsv3_gb200_guide_row(rec: dict, layout) -> None:
    """A DeepSeek-V3 GB200 guide row: its TFLOPS/GPU, as the roadmap table prints it, gives the entered step under
    Megatron-LM's FLOP count without an MTP layer (the reproduce script sets none; within 0.01%), the dispatcher is the
    table's, and GPUs, degrees and batch are those of the guide's stated configuration."""
    source = rec["source"]
    dispatcher, tflops = re.search(r"\| MXFP8 \| (\w+) \| [^|]+ \| ([0-9.]+) \|", source).groups()
    assert "no --mtp-num-layers" in source and "--moe-router-force-load-balancing" in source, rec["id"]
    flops = megatron_recipe_flops(dict(RECIPE_SHAPES[rec["model"]], mtp=0), rec["global_batch"], rec["seq_len"])
    assert rec["step_s"] == pytest.approx(flops / (rec["gpus"] * float(tflops) * 1e12), rel=1e-4), rec["id"]
    assert rec["moe_dispatcher"] == ("all-to-all" if dispatcher == "AlltoAll" else "deepep"), rec["id"]
    stated = f"TP{layout.tp}/PP{layout.pp}/VPP{layout.vpp}/EP{layout.ep}/MBS{layout.mbs}/GBS{rec['global_batch']}"
    assert f"{stated} on {rec['gpus']} GB200s" in source and f"--seq-length {rec['seq_len']}," in source, rec["id"]


def _check_amd(rec: dict) -> None:
    """The tokens/s per GPU as the blog quotes it."""
    assert "step_s" not in rec and "tokens_per_s_per_gpu" in rec, rec["id"]
    assert any(form in rec["source"] for form in _printed(rec["tokens_per_s_per_gpu"])), rec["id"]


TEST6_CHECKS = {
    "AMD ROCm performance results": _check_amd,
    "ms-swift": lambda rec: _check_megatron_swift_row(rec, fidelity.parse(rec["layout"], rec["gpus"])),
    "torchtitan graph_trainer": lambda rec: _check_titan_dsv3_scaling_row(
        rec, fidelity.parse(rec["layout"], rec["gpus"])
    ),
    "torchtitan DeepEP README": lambda rec: _check_titan_deepep_readme_row(
        rec, fidelity.parse(rec["layout"], rec["gpus"])
    ),
    "Megatron-FSDP v2": lambda rec: _check_megatron_fsdp_row(rec, fidelity.parse(rec["layout"], rec["gpus"])),
    "Megatron-LM DeepSeek-V3 GB200": lambda rec: _check_dsv3_gb200_guide_row(
        rec, fidelity.parse(rec["layout"], rec["gpus"])
    ),
    "MLPerf Training v": _check_mlperf,
    "ColossalAI llama2 example README": _check_colossalai,
    "torchtitan PR #481": _check_torchtitan_pr,
}


def test_test6_figures_are_the_numbers_their_sources_quote():
    """Every test6 figure agrees with the rest of its source line (each origin's check above; a run of an origin
    without one fails), and each layout multiplies out to its GPU count."""
    runs = _set("test6")
    assert runs
    for rec in runs:
        checks = [check for prefix, check in TEST6_CHECKS.items() if rec["origin"].startswith(prefix)]
        assert len(checks) == 1, rec["id"]
        checks[0](rec)
        assert fidelity.parse(rec["layout"], rec["gpus"]).world_size == rec["gpus"], rec["id"]


def test_test6_mlperf_models_are_their_parents_but_the_vocabulary():
    """MLPerf's Llama 3.1 405B is the catalog's but for the Mixtral tokenizer's 32,000 tokens (embedding and head);
    its GPT-3 175B counts 175B parameters with GPT-3's shape."""
    models = fidelity._models(fidelity._catalog())
    llama, parent = models["mlperf-llama3.1-405b"], fidelity.load_model("llama3-405b")
    assert parent.params - llama.params == 2 * (parent.vocab - llama.vocab) * llama.hidden
    assert round(models["mlperf-gpt3-175b"].params / 1e9) == 175
