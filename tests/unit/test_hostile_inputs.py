"""Hostile inputs, as a careful user or a reviewer tries them: each is refused with exit status 2 and
exactly one line on stderr (``meshwise: error: ...`` naming the field), no traceback, and nothing
written or left behind in the working folder. Every case runs before any training starts: a case
that slipped through would train (two steps of a micro model) and then fail its assertions.

Checkpoints, corrupted in each way the reliability section lists, are in test_checkpoint_damage.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from meshwise.cli import main

MICRO = "[model]\nlayers = 2\nhidden = 32\nheads = 2\nkv_heads = 2\nffn_hidden = 64\nvocab = 256\nmax_seq = 32\n"
PROFILE = """name = "{name}"
memory_bytes = {memory}
peak_bf16_flops_per_s = {flops}
hbm_bytes_per_s = 1e12
intra_bytes_per_s = 1e11
intra_latency_s = 1e-5
inter_bytes_per_s = 1e10
inter_latency_s = 1e-5
"""
NOT_UTF8 = b'name = "\xff\xfe"\n'
BAD_TEXT = os.fsdecode(b"\xff 7 =")  # what Python makes of command-line bytes that are not UTF-8


def _profile(folder: Path, memory: str = "80e9", flops: str = "1e15", name: str = "x") -> str:
    path = folder / "gpu.toml"
    path.write_text(PROFILE.format(name=name, memory=memory, flops=flops))
    return str(path)


def _train(folder: Path, *extra: str) -> list[str]:
    (folder / "micro.toml").write_text(MICRO)
    return [
        "train",
        "--model",
        str(folder / "micro.toml"),
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        str(folder / "ck"),
        "--metrics",
        str(folder / "m.jsonl"),
        "--prompt=",
        *extra,
    ]


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "pipe")
    return str(folder / "pipe")


def _file(folder: Path, name: str, data: bytes = b"x") -> str:
    (folder / name).write_bytes(data)
    return str(folder / name)


def _dir(folder: Path, name: str) -> str:
    (folder / name).mkdir(exist_ok=True)
    return str(folder / name)


def _holding_checkpoint(folder: Path) -> str:
    ck = folder / "ck" / "step-3"
    ck.mkdir(parents=True)
    (ck / "meshwise.json").write_text("{}")
    return str(folder / "ck")


# (case id, arguments built in the test's folder, text the one line must contain)
CASES = [
    # numbers
    ("params-nan", lambda f: ["plan", "--params", "nan"], "--params: 'nan' must be a finite number above 0"),
    ("params-inf", lambda f: ["plan", "--params", "inf"], "--params: 'inf' must be a finite number above 0"),
    ("params-negative", lambda f: ["plan", "--params=-7e9"], "must be a finite number above 0"),
    ("lr-nan", lambda f: _train(f, "--lr", "nan"), "--optimizer.lr: nan must be a finite number"),
    ("lr-inf", lambda f: _train(f, "--lr", "inf"), "--optimizer.lr: inf must be a finite number"),
    ("beta1-2", lambda f: _train(f, "--optimizer.beta1", "2"), "--optimizer.beta1: 2.0 must be in [0, 1)"),
    ("beta2-negative", lambda f: _train(f, "--optimizer.beta2=-0.1"), "--optimizer.beta2: -0.1 must be in [0, 1)"),
    ("weight-decay-negative", lambda f: _train(f, "--optimizer.weight_decay=-1"), "must not be negative"),
    ("eps-negative", lambda f: _train(f, "--optimizer.eps=-1e-8"), "--optimizer.eps: -1e-08 must be positive"),
    (
        "grad-clip-nan",
        lambda f: _train(f, "--optimizer.grad_clip", "nan"),
        "--optimizer.grad_clip: nan must be a finite",
    ),
    ("train-temperature-inf", lambda f: _train(f, "--generate.temperature", "inf"), "--generate.temperature: inf"),
    ("seed-past-64-bits", lambda f: _train(f, "--model.seed", str(2**70)), "--model.seed: 1180591620717411303424"),
    ("data-seed-negative", lambda f: _train(f, "--data.seed=-1"), "--data.seed: -1 must be in [0, 2**64)"),
    ("nproc-0", lambda f: _train(f, "--nproc-per-node", "0"), "--nproc-per-node: 0 must be at least 1"),
    ("max-restarts-negative", lambda f: _train(f, "--max-restarts=-1"), "--max-restarts: -1 must be 0 or more"),
    ("timeout-zero", lambda f: _train(f, "--timeout", "0"), "--timeout: 0 must be a positive, finite number"),
    ("timeout-nan", lambda f: _train(f, "--timeout", "nan"), "--timeout: nan must be a positive, finite number"),
    ("train-prompt-not-utf8", lambda f: _train(f, "--prompt", BAD_TEXT), "--generate.prompt: not valid UTF-8"),
    (
        "generate-temperature-nan",
        lambda f: ["generate", "--checkpoint", str(f), "--temperature", "nan"],
        "--temperature: nan must be a finite number",
    ),
    (
        "generate-temperature-inf",
        lambda f: ["generate", "--checkpoint", str(f), "--temperature", "inf"],
        "--temperature: inf must be a finite number",
    ),
    (
        "generate-seed-past-64-bits",
        lambda f: ["generate", "--checkpoint", str(f), "--seed", str(2**64)],
        "--seed: 18446744073709551616 must be in [0, 2**64)",
    ),
    (
        "generate-prompt-not-utf8",
        lambda f: ["generate", "--checkpoint", str(f), "--prompt", BAD_TEXT],
        "--prompt: not valid UTF-8",
    ),
    ("measure-nproc-0", lambda f: ["measure", "--nproc-per-node", "0"], "--nproc-per-node: 0 must be at least 1"),
    (
        "calibrate-nproc-0",
        lambda f: ["calibrate", "--nproc-per-node", "0", "--out", str(f / "p.toml")],
        "--nproc-per-node: 0 must be at least 1",
    ),
    # input files
    ("config-not-utf8", lambda f: _train(f, "--config", _file(f, "c.toml", NOT_UTF8)), "is not UTF-8 text"),
    ("config-a-folder", lambda f: _train(f, "--config", _dir(f, "c.toml")), "c.toml is a folder; give a TOML file"),
    ("gpu-a-folder", lambda f: ["plan", "--gpu", _dir(f, "g")], "is a folder; give a catalog name"),
    ("pretrained-a-plain-folder", lambda f: _train(f, "--model.pretrained", _dir(f, "hf")), "--model.pretrained: "),
    ("gpu-profile-not-utf8", lambda f: ["plan", "--gpu", _file(f, "g.toml", NOT_UTF8)], "is not UTF-8 text"),
    (
        "gpu-profile-string",
        lambda f: ["plan", "--gpu", _profile(f, flops='"fast"')],
        "peak_bf16_flops_per_s must be a number, got 'fast'",
    ),
    (
        "gpu-profile-zero",
        lambda f: ["plan", "--gpu", _profile(f, flops="0")],
        "peak_bf16_flops_per_s must be a finite number above 0",
    ),
    (
        "gpu-profile-nan",
        lambda f: ["plan", "--gpu", _profile(f, memory="nan")],
        "memory_bytes must be a finite number above 0",
    ),
    (
        "gpu-profile-inf",
        lambda f: ["plan", "--gpu", _profile(f, flops="inf")],
        "peak_bf16_flops_per_s must be a finite number above 0",
    ),
    ("data-fifo", lambda f: _train(f, "--data", _fifo(f)), "is not a regular file or a folder"),
    ("data-dev-zero", lambda f: _train(f, "--data", "/dev/zero"), "/dev/zero is not a regular file or a folder"),
    # output paths
    (
        "checkpoint-dir-a-file",
        lambda f: _train(f) + ["--checkpoint-dir", _file(f, "plain")],
        "exists and is not a folder",
    ),
    (
        "checkpoint-dir-under-proc",
        lambda f: _train(f) + ["--checkpoint-dir", "/proc/meshwise-ck"],
        "is on a kernel file system",
    ),
    (
        "checkpoint-dir-holding-checkpoints",
        lambda f: _train(f) + ["--checkpoint-dir", _holding_checkpoint(f)],
        "already holds checkpoints (latest step-3); continue them with --resume auto",
    ),
    ("metrics-a-folder", lambda f: _train(f) + ["--metrics", _dir(f, "metrics")], "--metrics.file: "),
    (
        "metrics-missing-folder",
        lambda f: _train(f) + ["--metrics.file", str(f / "nowhere" / "m.jsonl")],
        "--metrics.file: folder ",
    ),
    (
        "plan-report-missing-folder",
        lambda f: ["plan", "--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--report", str(f / "nowhere" / "r.html")],
        "does not exist",
    ),
    (
        "plan-report-onto-folder",
        lambda f: ["plan", "--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--report", _dir(f, "r.html")],
        "is a folder; give a file name",
    ),
    ("measure-report-onto-folder", lambda f: ["measure", "--report", _dir(f, "m.html")], "is a folder"),
    ("calibrate-out-missing-folder", lambda f: ["calibrate", "--out", str(f / "nowhere" / "p.toml")], "does not exist"),
    ("calibrate-out-onto-folder", lambda f: ["calibrate", "--out", _dir(f, "p.toml")], "is a folder"),
    (
        "export-out-onto-folder",
        lambda f: ["export", "--checkpoint", str(f), "--out", _dir(f, "o.safetensors")],
        "is a folder",
    ),
    # empty values: refused, never read as "not given" (the default)
    ("plan-model-empty", lambda f: ["plan", "--model", ""], "--model: an empty value; give a catalog name"),
    ("plan-layout-empty", lambda f: ["plan", "--layout", ""], "--layout: an empty value; give key=value"),
    ("plan-report-empty", lambda f: ["plan", "--report", ""], "--report: an empty value"),
    ("plan-layout-empty-item", lambda f: ["plan", "--layout", "dp=8,,tp=8"], "layout: 'dp=8,,tp=8' has an empty item"),
    ("verify-model-empty", lambda f: ["verify", "--layout", "dp=64", "--model", ""], "--model: an empty value"),
    ("verify-layout-empty", lambda f: ["verify", "--layout", ""], "--layout: an empty value"),
    ("verify-layout-empty-item", lambda f: ["verify", "--layout", "dp=32,,tp=2"], "has an empty item"),
    ("train-model-empty", lambda f: _train(f, "--model", ""), "--model.name: an empty value"),
    ("train-layout-empty", lambda f: _train(f, "--layout", ""), "--layout.choice: an empty value"),
    ("measure-model-empty", lambda f: ["measure", "--model", ""], "--model: an empty value"),
    ("measure-layout-empty", lambda f: ["measure", "--layout", " "], "--layout: an empty value"),
    ("measure-report-empty", lambda f: ["measure", "--report", ""], "--report: an empty value"),
    # argparse's own refusals in the house form: the field first
    ("plan-gpus-not-a-number", lambda f: ["plan", "--gpus", "abc"], "meshwise: error: --gpus: invalid int value 'abc'"),
    ("plan-params-zero", lambda f: ["plan", "--params", "0"], "meshwise: error: --params: '0' must be a finite"),
    # verify checks as plan does, before any trace
    (
        "verify-seq-len-0",
        lambda f: ["verify", "--layout", "dp=64", "--seq-len", "0"],
        "--seq-len: 0 must be at least 1",
    ),
    (
        "verify-seq-past-max-seq",
        lambda f: ["verify", "--layout", "dp=64", "--seq-len", "8193"],
        "--seq-len: 8193 is longer than the model's max_seq 8192",
    ),
    (
        "verify-chunks-past-layers",
        lambda f: ["verify", "--gpus", "8", "--layout", "dp=1,pp=8,vpp=11,schedule=interleaved-1f1b"],
        "layout: pp*vpp = 88 is more than the model's 80 layers",
    ),
    # measure checks every flag before calibrating (a calibration would write ~/.cache: see _isolated_cache)
    (
        "measure-global-batch-0",
        lambda f: ["measure", "--global-batch", "0", "--nproc-per-node", "1"],
        "--global-batch: 0 must be at least 1",
    ),
    (
        "measure-seq-len-0",
        lambda f: ["measure", "--seq-len", "0", "--nproc-per-node", "1"],
        "--seq-len: 0 must be at least 1",
    ),
    # train checks a given layout before calibrating
    ("train-layout-unknown-key", lambda f: _train(f, "--layout.choice", "foo=2"), "layout: unknown key 'foo'"),
    ("train-layout-wrong-world", lambda f: _train(f, "--layout.choice", "dp=2"), "but the world size is 1"),
    # keys that would do nothing, as vpp without pp
    ("plan-sp-without-tp", lambda f: ["plan", "--gpus", "64", "--layout", "dp=64,sp=on"], "sp=on splits the sequence"),
    (
        "plan-schedule-without-pp",
        lambda f: ["plan", "--gpus", "64", "--layout", "dp=64,schedule=interleaved-1f1b"],
        "schedule=interleaved-1f1b is a pipeline schedule; it needs pp > 1",
    ),
    # absurd sizes: a documented bound, answered at once
    (
        "plan-seq-len-absurd",
        lambda f: ["plan", "--seq-len", "99999999999999999999"],
        "--seq-len: 99999999999999999999 is past meshwise's bound of 16,777,216",
    ),
    (
        "plan-seq-past-max-seq-search",
        lambda f: ["plan", "--seq-len", "524288", "--global-batch", "2"],
        "--seq-len: 524288 is longer than the model's max_seq 8192",
    ),
    ("plan-params-absurd", lambda f: ["plan", "--params", "1e30"], "--params: 1e+30 is past meshwise's bound"),
    ("plan-gpus-absurd", lambda f: ["plan", "--gpus", "100000000000"], "--gpus: 100000000000 is past meshwise's bound"),
    (
        "train-global-batch-past-corpus",
        lambda f: _train(f, "--schedule.global_batch", "100000000000"),
        "--schedule.global_batch: 100000000000 sequences per step is more than the training set's",
    ),
    # too big
    ("model-too-big-for-this-machine", lambda f: _train(f) + ["--model", "llama3-405b"], "needs about"),
]


@pytest.mark.parametrize("make_args,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, make_args, expected) -> None:
    monkeypatch.setenv("MESHWISE_CACHE_DIR", str(tmp_path / "cache"))  # a calibration would write here: a failure
    args = make_args(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    try:
        status = main(args)
    except SystemExit as e:  # argparse's own refusals
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("meshwise: error: "), err
    assert expected in err and "Traceback" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_matrix_has_every_documented_case() -> None:
    """docs/reliability.md counts these cases; keep the two in step."""
    readme = (Path(__file__).parents[2] / "docs/reliability.md").read_text()
    assert f"{len(CASES)} hostile inputs" in readme


def test_plan_gpus_1e9_is_refused_without_enumerating_a_billion_divisors(capsys) -> None:
    from meshwise.plan.planner import _divisors

    assert _divisors(1_000_000_000)[:6] == [1, 2, 4, 5, 8, 10] and len(_divisors(1_000_000_000)) == 100
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and _divisors(1) == [1] and _divisors(97) == [1, 97]
    assert main(["plan", "--gpus", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpus: 1000000000 is past meshwise's bound of 1,048,576 devices" in err


def test_seq_past_max_seq_is_one_rule_for_search_and_layout(capsys) -> None:
    """Under --runtime megatron (rotary positions for any length) the search and --layout both plan
    past max_seq; under meshwise's runtime both refuse (the matrix above)."""
    base = ["plan", "--seq-len", "16384", "--global-batch", "8", "--gpus", "64", "--runtime", "megatron", "--json"]
    assert main(base) == 0
    assert main([*base, "--layout", "dp=8,zero=3,tp=8"]) == 0
    capsys.readouterr()


def test_report_escapes_a_hostile_model_name(tmp_path, capsys) -> None:
    model = tmp_path / "evil.toml"
    model.write_text(MICRO.replace("[model]\n", '[model]\nname = "<script>alert(1)</script>"\n'))
    gpu = _profile(tmp_path, name="<img src=x onerror=alert(2)>")
    out = tmp_path / "r.html"
    assert (
        main(["plan", "--model", str(model), "--gpu", gpu, "--gpus", "2", "--global-batch", "8", "--report", str(out)])
        == 0
    )
    html = out.read_text()
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(2)&gt;" in html


def test_unreadable_profile_is_one_line(tmp_path, capsys) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file: a permission error cannot be provoked")
    gpu = Path(_profile(tmp_path))
    gpu.chmod(0)
    try:
        assert main(["plan", "--gpu", str(gpu)]) == 2
    finally:
        gpu.chmod(stat.S_IRUSR | stat.S_IWUSR)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be read" in err
