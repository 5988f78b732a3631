"""The `meshwise plan` command as a user runs it: output, JSON schema, bad input, no torch import."""

import json
import subprocess
import sys

import pytest

from meshwise.cli import main
from meshwise.plan.planner import TIE


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshwise.cli", *args], capture_output=True, text=True, timeout=60)


def test_memory_wall_acceptance():
    r = run("plan", "--params", "70e9", "--precision", "bf16", "--gpu", "a100-80gb", "--gpus", "1")
    assert r.returncode == 3, r.stderr  # nothing fits: its own status
    out = r.stdout
    assert "840.0 GB" in out and "does not fit" in out and "Nothing fits" in out
    assert "What would: More devices" in out


def test_json_schema(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--gpu",
                "h100",
                "--gpus",
                "16",
                "--seq-len",
                "4096",
                "--global-batch",
                "64",
                "--top",
                "3",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"candidates", "explanation", "warnings"}
    assert 1 <= len(data["candidates"]) <= 3
    c = data["candidates"][0]
    assert set(c["layout"]) == {
        "dp",
        "zero",
        "shard",
        "ep",
        "cp",
        "tp",
        "sp",
        "pp",
        "vpp",
        "schedule",
        "mbs",
        "accum",
        "ac",
    }
    assert c["layout"]["sp"] in ("on", "off") and c["layout"]["ac"] in ("none", "selective", "full")
    assert c["fits"] is True
    mem = c["memory"]
    assert set(mem) == {"params", "grads", "optimizer", "activations", "other", "total", "capacity"}
    assert all(isinstance(v, int) for v in mem.values())
    assert mem["total"] == pytest.approx(
        sum(mem[k] for k in ("params", "grads", "optimizer", "activations", "other")), abs=5
    )
    assert set(c["time"]) >= {"step_s", "compute_s", "comm_exposed_s", "bubble_s"}
    for op in c["comm"]:
        assert set(op) == {"kind", "dim", "bytes_per_step", "count_per_step"}
    for key in ("tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"):
        assert c[key] > 0
    lay = c["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 16 and lay["mbs"] * lay["accum"] * lay["dp"] == 64
    speeds = [x["tokens_per_s"] for x in data["candidates"]]
    assert max(speeds) <= speeds[0] * (1 + TIE) + 1e-9  # best first, up to a tie (planner.break_ties)


def test_layout_flag_evaluates_one_layout(capsys):
    assert main(["plan", "--model", "llama3-70b", "--gpus", "8", "--layout", "dp=8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["candidates"]) == 1 and data["candidates"][0]["fits"] is False


def test_human_output_has_the_table(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "MFU" in out and "Chosen:" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "gpt-9000"], "unknown model"),
        (["--gpu", "tpu9"], "unknown accelerator"),
        (["--gpus", "8", "--layout", "dp=2,tp=2"], "world size is 8"),
        (["--model", "llama3-8b", "--gpus", "3", "--layout", "tp=3"], "tp=3 does not divide"),
        (["--model", "tiny", "--gpu", "cpu", "--gpus", "4", "--layout", "tp=4"], "kv_heads"),
        (
            ["--model", "tiny", "--gpu", "cpu", "--gpus", "4", "--global-batch", "6", "--layout", "dp=4"],
            "global batch 6",
        ),
        (["--params", "1e9", "--gpus", "8", "--global-batch", "7"], "--global-batch"),
        (["--gpus", "zero"], "--gpus"),
        (["--params", "0"], "--params: '0' must be a finite number above 0"),
        (["--precision", "fp4"], "--precision"),
        (["--model", "x.json"], "does not exist"),
        (["--bogus"], "unrecognized"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run("plan", *args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("meshwise: error:")
    assert "Traceback" not in r.stderr


def test_plan_never_imports_torch():
    code = (
        "import sys, io, contextlib; from meshwise.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['plan', '--model', 'tiny', '--gpu', 'cpu', '--gpus', '4'])\n"
        "import meshwise, meshwise.plan.planner, meshwise.cost.estimate, meshwise.plan.show\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'meshwise.launch' not in sys.modules, 'the launch package was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_nothing_fits_has_its_own_status_and_the_json_says_why(capsys):
    """A script tells "nothing fits" from a plan (0) and from bad input (2): status 3, and the JSON's
    status and why_nothing_fits."""
    from meshwise.errors import NOTHING_FITS

    assert NOTHING_FITS not in (0, 1, 2)
    assert main(["plan", "--params", "70e9", "--gpu", "a100-80gb", "--gpus", "1", "--json"]) == NOTHING_FITS
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "nothing fits" and data["candidates"] == []
    why = data["why_nothing_fits"]
    assert why["reason"].startswith("Nothing fits") and any(w.startswith("More devices") for w in why["what_would"])
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "fits" and "why_nothing_fits" not in data


def test_version(capsys):
    from meshwise import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"meshwise {__version__}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["train"],
        ["measure", "--layout", "dp=2"],
        ["verify", "--layout", "dp=8"],
        ["calibrate"],
        ["plan", "--verify", "2"],
    ],
)
def test_the_runtime_commands_refuse_without_torch(monkeypatch, capsys, args):
    """As a `pip install meshwise` without the train extra sees it (the clean-venv test runs the wheel)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs torch" in err and "pip install 'meshwise[train]'" in err
