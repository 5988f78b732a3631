"""``meshwise train`` end to end against a plain training loop under ``torchrun`` (CPU, gloo).

Both runs are whole jobs, each started by its own launcher:

- **meshwise**: ``meshwise train`` started directly (its own elastic launcher, ``--nproc-per-node``),
  ``small``, ``--layout.choice dp=1,mbs=B`` at one process, ``dp=2,zero=3,mbs=B/2`` at two; no
  checkpoints, no sample, eval only at the last step (after it is timed). Its step time is the
  ``step_s`` of its own metrics file (rank 0's: the step's rows, forward, backward, clipping,
  optimizer and the loss read).
- **plain**: this file under ``python -m torch.distributed.run --standalone``: the same module
  (``meshwise.runtime.build_model``, the same seed), at two processes torch's own ``fully_shard`` on
  every block and the root, ``torch.optim.AdamW(foreach=True)`` with the same settings,
  ``clip_grad_norm_``, ``loss.item()`` per step, the same micro-batch of the same token rows (the
  embedded corpus' training rows, as ``train`` reads them). Its step time is rank 0's, from the
  end of one loop iteration to the end of the next (everything the loop does).

Threads: the cores split evenly among the processes (2 threads at one process, 1 each at two on
this 2-core machine), as ``train`` sets them. Rounds alternate the order of the two jobs. Per
run, the first ``--skip`` steps are dropped and the median of the rest taken; per world, printed:
min / median / max over rounds of those medians, and the ratio meshwise speed / plain speed =
plain / meshwise (of the medians over rounds, and per round).

A benchmark that prints, not a test; run it alone on a quiet host:

    python benchmarks/train_vs_torchrun.py [--rounds 3] [--steps 20] [--skip 4] [--worlds 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL, SEQ, BATCH = "small", 128, 8
THREADS_ENV = "MESHWISE_THREADS"  # meshwise.train.layout_choice.THREADS_ENV, set for every run alike


def layout_text(world: int) -> str:
    return f"dp=1,mbs={BATCH}" if world == 1 else f"dp={world},zero=3,mbs={BATCH // world}"


def run_meshwise(world: int, steps: int, folder: Path, torchrun: bool = False) -> list[float]:
    """``meshwise train`` under its own launcher (or as torchrun's worker); the step times of its
    metrics file."""
    metrics = folder / f"meshwise-{world}.jsonl"
    start = [sys.executable, "-m", "meshwise.cli", "train"]
    if torchrun:
        start = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        start += ["-m", "meshwise.train"]
    cmd = [*start, "--model.name", MODEL, "--data.seq_len", str(SEQ)]
    cmd += ["--schedule.global_batch", str(BATCH), "--schedule.steps", str(steps), "--schedule.eval_every", "0"]
    cmd += ["--layout.choice", layout_text(world), "--checkpoint.dir", "", "--generate.prompt", ""]
    cmd += ["--metrics.file", str(metrics)]
    _run(cmd if torchrun else [*cmd, "--nproc-per-node", str(world)])
    return [json.loads(line)["step_s"] for line in metrics.read_text().splitlines()]


def run_plain(world: int, steps: int, folder: Path, allocator: bool = False) -> list[float]:
    """The plain loop under torchrun; rank 0's time per loop iteration. ``allocator``: with the
    host allocator setting meshwise gives one-thread ranks (meshwise.launch.allocator)."""
    out = folder / f"plain-{world}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    cmd += [__file__, "--plain-worker", "--steps", str(steps), "--out", str(out)]
    cmd += ["--allocator"] if allocator else []
    _run(cmd)
    return json.loads(out.read_text())


def _run(cmd: list[str]) -> None:
    threads = str(max(1, (os.cpu_count() or 1) // int(cmd[cmd.index("--nproc-per-node") + 1])))
    env = {**os.environ, "OMP_NUM_THREADS": threads, THREADS_ENV: threads}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def plain_worker(steps: int, out: str, allocator: bool) -> None:
    """One rank of the plain loop (started by torchrun)."""
    import torch
    import torch.distributed as dist

    from meshwise.launch.allocator import keep_freed_host_memory
    from meshwise.runtime import OptimizerConfig, build_model, loss_sum
    from meshwise.spec import load_model
    from meshwise.train.config import DataConfig
    from meshwise.train.data import build_corpus

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if allocator and torch.get_num_threads() == 1:  # as meshwise.launch.init_process_group does
        keep_freed_host_memory()
    dist.init_process_group("gloo")
    spec, cfg = load_model(MODEL), OptimizerConfig()
    torch.manual_seed(0)
    model = build_model(spec, 0)
    if world > 1:
        from vs_torch import fully_shard_blocks  # beside this file

        fully_shard_blocks(model, world)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=True,
    )
    corpus = build_corpus(DataConfig(seq_len=SEQ), spec.vocab)
    rows = range(rank * BATCH // world, (rank + 1) * BATCH // world)
    times: list[float] = []
    last = time.perf_counter()
    for step in range(steps):
        x, y = corpus.train_rows(step * BATCH, rows)
        opt.zero_grad(set_to_none=True)
        loss = loss_sum(model(x), y) / y.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        loss.item()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def _summary(values: list[float]) -> str:
    return " ".join(f"{v * 1e3:8.1f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=4, help="first steps of each run not counted")
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--also-torchrun", action="store_true", help="also meshwise train as torchrun's worker")
    ap.add_argument(
        "--also-allocator", action="store_true", help="also the plain loop with meshwise's allocator setting"
    )
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker:
        plain_worker(args.steps, args.out, args.allocator)
        return
    print(f"$ python {' '.join(sys.argv)}")
    print(f"load average at the start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs = {"plain torchrun": run_plain, "meshwise train": run_meshwise}
    if args.also_allocator:
        runs["plain + allocator"] = lambda world, steps, folder: run_plain(world, steps, folder, True)
    if args.also_torchrun:
        runs["meshwise under torchrun"] = lambda world, steps, folder: run_meshwise(world, steps, folder, True)
    with tempfile.TemporaryDirectory(prefix="meshwise-vs-torchrun-") as name:
        for world in (int(w) for w in args.worlds.split(",")):
            medians: dict[str, list[float]] = {k: [] for k in runs}
            for r in range(args.rounds):
                for label in list(runs) if r % 2 == 0 else list(reversed(runs)):
                    steps_s = runs[label](world, args.steps, Path(name))[args.skip :]
                    medians[label].append(statistics.median(steps_s))
            threads = max(1, (os.cpu_count() or 1) // world)
            print(
                f"{world} process(es) x {threads} thread(s), {MODEL}, batch {BATCH} x {SEQ}, {layout_text(world)}; "
                f"{args.rounds} interleaved rounds of {args.steps} steps, the first {args.skip} dropped"
            )
            print("  ms/step, medians of the rounds: min / median / max")
            for label, values in medians.items():
                print(f"  {label:24} {_summary(values)}")
            plain, mine = medians["plain torchrun"], medians["meshwise train"]
            per_round = " ".join(f"{p / m:.3f}" for p, m in zip(plain, mine, strict=True))
            ratio = statistics.median(plain) / statistics.median(mine)
            print(f"  meshwise speed / plain speed: {ratio:.3f} (medians); per round {per_round}")
            for label in [k for k in medians if k not in ("plain torchrun", "meshwise train")]:
                other = statistics.median(plain) / statistics.median(medians[label])
                print(f"  {label} speed / plain speed: {other:.3f} (medians)")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
