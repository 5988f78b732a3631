"""The GPU check (scripts/gpu_check.sh runs it in the project's environment): on whatever CUDA device
the machine has, in one go and within 10 minutes,

1. ``meshwise calibrate --device cuda`` (Llama 3 8B's shapes): the GPU op model's constants, under 2 minutes;
2. ``meshwise measure`` of Llama 3.2 1B's shape (benchmarks/models/llama3.2-1b.toml) on one GPU,
   ``dp=1,mbs=2``, 8 x 2,048 tokens, in bf16-mixed and fp8 (where the device runs it), each predicted
   with the profile just measured: step time, MFU (the plan's MFU scaled by predicted / measured step)
   and memory (MemTracker's total and the CUDA allocator's peaks) beside the plan;
3. 3 steps of ``plan --emit torchtitan``'s configuration for torchtitan's debug model
   (benchmarks/models/llama3-debug.toml) under torchtitan's own trainer.

It writes ``benchmarks/results/gpu-check-<device>.txt`` (one file per device kind, overwritten) and
exits 1 when a step failed, 2 when there is no CUDA device. ``--cpu`` runs the same steps on the CPU
at toy sizes (calibrate ``--toy``, the ``tiny`` model, torchtitan up to the backward FlexAttention
has no CPU kernel for; fp8 left out: torchao's float8 GEMMs take about 50 s a step on a CPU), so
that CI checks the plumbing; its figures describe nothing.

    python benchmarks/gpu_check.py [--cpu] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
CALIBRATE_LIMIT_S = 120.0  # the calibration's promise; a slower one is reported as a failure
TITAN_TEXT = [f"the quick brown fox {i} jumps over the lazy dog number {i * 7} and keeps running" for i in range(200)]


@dataclass(frozen=True)
class Sizes:
    """What each step runs: on a GPU, or at toy sizes on the CPU."""

    calibrate: list[str]
    model: str
    layout: str
    global_batch: int
    seq_len: int
    titan_seq_len: int
    timeout_s: dict[str, int]


GPU = Sizes(
    ["--device", "cuda", "--model", "llama3-8b"],
    str(MODELS / "llama3.2-1b.toml"),
    "dp=1,mbs=2",
    8,
    2048,
    2048,
    {"calibrate": 170, "measure": 120, "torchtitan": 150},
)
CPU = Sizes(
    ["--toy", "--model", "small"],
    "tiny",
    "dp=1,mbs=1",
    2,
    32,
    128,
    {"calibrate": 120, "measure": 120, "torchtitan": 150},
)


def run(cmd: list[str], timeout_s: int, env: dict[str, str] | None = None, cwd: Path | None = None):
    """(exit status, stdout + stderr, seconds) of ``cmd``; 124 when it ran past ``timeout_s``."""
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(killed after {timeout_s} s)", time.perf_counter() - start


def meshwise(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshwise.cli", *args]


def device_name(cpu: bool) -> str:
    import torch

    return "cpu" if cpu else torch.cuda.get_device_name(0)


def step_calibrate(sizes: Sizes, profile: Path, say) -> bool:
    rc, out, seconds = run(meshwise("calibrate", *sizes.calibrate, "--out", str(profile)), sizes.timeout_s["calibrate"])
    say(f"## calibrate ({' '.join(sizes.calibrate)}): exit {rc}, {seconds:.1f} s (limit {CALIBRATE_LIMIT_S:.0f} s)")
    say(*[f"  {line}" for line in out.strip().splitlines()[-24:]])
    return rc == 0 and seconds <= CALIBRATE_LIMIT_S + 15  # the interpreter's and torch's start-up beside it


def _row(rows: list[dict], figure: str) -> dict | None:
    return next((r for r in rows if r["figure"] == figure and r["rank"] == 0), None)


def step_measure(sizes: Sizes, profile: Path, precision: str, say) -> bool:
    """``measure`` beside ``plan`` for one precision (``auto``: the device's own, fp32 on a CPU):
    step time, MFU and memory."""
    common = [
        "--model",
        sizes.model,
        "--layout",
        sizes.layout,
        "--global-batch",
        str(sizes.global_batch),
        "--seq-len",
        str(sizes.seq_len),
        "--gpu",
        str(profile),
    ]
    rc, out, seconds = run(
        meshwise("measure", "--nproc-per-node", "1", "--steps", "3", *common, "--precision", precision, "--json"),
        sizes.timeout_s["measure"],
    )
    say(f"## measure {Path(sizes.model).stem} {sizes.layout} {precision}: exit {rc}, {seconds:.1f} s")
    if rc != 0:
        say(*[f"  {line}" for line in out.strip().splitlines()[-15:]])
        return False
    rows = json.loads(next(line for line in out.splitlines() if line.startswith("{")))["rows"]
    planned = "fp32" if precision == "auto" else precision
    prc, pout, _ = run(meshwise("plan", "--gpus", "1", *common, "--precision", planned, "--json"), 60)
    step = _row(rows, "time.step_s")
    if prc == 0 and step:
        plan = json.loads(pout)["candidates"][0]
        mfu = plan["mfu"] * step["predicted"] / step["measured"]
        say(
            f"  step {step['measured']:.4f} s measured, {step['predicted']:.4f} s planned ({step['rel_error']:+.1%}); "
            f"MFU {mfu:.1%} measured, {plan['mfu']:.1%} planned"
        )
    for figure in (
        "memory.total",
        "memory.cuda_peak_allocated",
        "memory.cuda_peak_reserved",
        "time.compute_s",
        "time.optimizer_s",
    ):
        row = _row(rows, figure)
        if row:
            unit, scale = ("s", 1) if figure.startswith("time.") else ("GB", 1e9)
            say(
                f"  {figure}: {row['measured'] / scale:.4g} {unit} measured, {row['predicted'] / scale:.4g} {unit} "
                f"planned ({row['rel_error']:+.1%})"
            )
    return step is not None


def titan_assets(folder: Path) -> tuple[str, str]:
    """A 500-token BPE tokenizer (the debug model has 2,048 embeddings) and a text data set."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok_dir, data_dir = folder / "tokenizer", folder / "data"
    tok_dir.mkdir()
    data_dir.mkdir()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TITAN_TEXT,
        trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]),
    )
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    )
    (data_dir / "rows.txt").write_text("\n".join(TITAN_TEXT))
    return str(tok_dir), str(data_dir)


def step_torchtitan(sizes: Sizes, cpu: bool, say) -> bool:
    """``plan --emit torchtitan`` for the debug model on one device, then 3 steps of torchtitan's trainer."""
    seq = str(sizes.titan_seq_len)
    emitted = subprocess.run(
        meshwise(
            "plan",
            "--model",
            str(MODELS / "llama3-debug.toml"),
            "--gpus",
            "1",
            "--gpu",
            "h100",
            "--layout",
            "dp=1,mbs=1",
            "--global-batch",
            "2",
            "--seq-len",
            seq,
            "--emit",
            "torchtitan",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if emitted.returncode != 0:
        say(
            f"## torchtitan: plan --emit torchtitan failed (exit {emitted.returncode})",
            *emitted.stderr.strip().splitlines()[-5:],
        )
        return False
    body = " ".join(line for line in emitted.stdout.splitlines() if not line.startswith("#")).replace("\\", " ")
    words = shlex.split(body.replace("$MASTER_ADDR", "localhost"))
    args = words[words.index("torchtitan.train") + 1 :]
    with tempfile.TemporaryDirectory(prefix="meshwise-gpu-check-titan-") as tmp:
        tok, data = titan_assets(Path(tmp))
        local = [
            "--training.steps",
            "3",
            "--hf_assets_path",
            tok,
            "--dataloader.dataset_path",
            data,
            "--dump_folder",
            str(Path(tmp) / "out"),
            "--metrics.log_freq",
            "1",
        ]
        args = args[:-1] + local + args[-1:]  # the checkpointing subcommand stays last
        stubs = [str(ROOT / "tests" / "_stubs")] if _missing("datasets") else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*stubs, str(ROOT), os.environ.get("PYTHONPATH", "")])}
        entry = [str(ROOT / "tests" / "_titan_cpu_train.py")] if cpu else ["-m", "torchtitan.train"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *entry, *args]
        rc, log, seconds = run(cmd, sizes.timeout_s["torchtitan"], env=env, cwd=Path(tmp))
    steps = [line.strip() for line in log.splitlines() if "step:" in line and "loss" in line]
    say(f"## torchtitan {' '.join(args[:4])} ... (3 steps, seq {seq}): exit {rc}, {seconds:.1f} s")
    say(*[f"  {line[-160:]}" for line in steps[-3:]])
    if cpu and rc != 0 and "FlexAttention does not support backward on CPU" in log:
        say(
            "  on the CPU torchtitan stops at its first backward (FlexAttention has no CPU backward): "
            "built, sharded and ran its forward; the steps need a CUDA device"
        )
        return "Training starts at step 1" in log
    if rc != 0:
        say(*[f"  {line}" for line in log.strip().splitlines()[-12:]])
    return rc == 0 and len(steps) >= 3


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the same steps on the CPU at toy sizes (plumbing only)")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device: torch.cuda.is_available() is False (torch "
            f"{torch.__version__}); --cpu runs the steps on the CPU at toy sizes",
            file=sys.stderr,
        )
        return 2
    sizes, name = (CPU if args.cpu else GPU), device_name(args.cpu)
    from meshwise.measure.calibrate_gpu import slug

    out = Path(args.out_dir) / f"gpu-check-{slug(name)}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    lines: list[str] = []

    def say(*text: str) -> None:  # the file grows line by line: a check stopped at its limit keeps what it did
        for line in text:
            print(line, flush=True)
            lines.append(line)
            with out.open("a") as f:
                f.write(line + "\n")

    start = time.perf_counter()
    say(
        f"# gpu check: {name}, {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, torch {torch.__version__}, "
        f"{torch.cuda.device_count() if not args.cpu else 0} CUDA device(s){', --cpu toy sizes' if args.cpu else ''}"
    )
    with tempfile.TemporaryDirectory(prefix="meshwise-gpu-check-") as tmp:
        profile = Path(tmp) / "profile.toml"
        ok = {"calibrate": step_calibrate(sizes, profile, say)}
        if profile.exists():
            say("## the profile", *[f"  {line}" for line in profile.read_text().splitlines()])
            fp8 = not args.cpu and torch.cuda.get_device_capability(0) >= (8, 9)
            for precision in ["bf16-mixed"] + (["fp8"] if fp8 else []):
                ok[f"measure {precision}"] = step_measure(sizes, profile, "auto" if args.cpu else precision, say)
            if not fp8:
                say(
                    "## measure fp8: left out ("
                    + (
                        "torchao's float8 GEMMs take ~50 s a step on a CPU)"
                        if args.cpu
                        else "the device has no float8 tensor cores)"
                    )
                )
        ok["torchtitan"] = step_torchtitan(sizes, args.cpu, say)
    failed = [k for k, v in ok.items() if not v]
    say(
        f"# {len(ok) - len(failed)} of {len(ok)} steps passed in {time.perf_counter() - start:.0f} s"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
