"""Where ``meshwise train``'s time goes around the step, at one process (in this process).

Runs ``meshwise train`` (``small``, seq 128, batch 8, ``dp=1,mbs=8``, 20
steps, no checkpoints, no sample; flags given override these) with timers on the loop's parts: the step window that ``train``
reports (``step_s``), and each call made around it per step (the metrics record, the memory peak,
the stop agreement, the checkpoint check, the fault hooks, the learning rate). Python's garbage
collections are timed by generation (``gc.callbacks``), with the objects the collector tracks
when the first step starts. ``--profile N`` prints cProfile's N costliest calls instead.

    python benchmarks/train_overhead.py [--profile 30] [TRAIN FLAGS]
    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/train_overhead.py \\
        --layout.choice dp=2,zero=3,mbs=4 ...     # under torchrun: every rank runs, rank 0 reports
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict

DEFAULT = [
    "--model.name", "small", "--data.seq_len", "128", "--schedule.global_batch", "8",
    "--schedule.steps", "20", "--schedule.eval_every", "0", "--layout.choice", "dp=1,mbs=8",
    "--checkpoint.dir", "", "--generate.prompt", "",
]  # fmt: skip

spent: dict[str, list[float]] = defaultdict(list)
gc_s: dict[int, list[float]] = defaultdict(list)
tracked: list[int] = []


def timed(owner: object, name: str, label: str) -> None:
    """Wrap ``owner.name`` so each call's seconds are added to ``spent[label]``."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label].append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def on_gc(phase: str, info: dict, started: list[float] = [0.0]) -> None:  # noqa: B006
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        gc_s[info["generation"]].append(time.perf_counter() - started[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest calls")
    args, train_args = ap.parse_known_args()  # the rest are train's flags
    from meshwise import launch
    from meshwise.runtime.parallelize import ParallelModel
    from meshwise.train import checkpoint, command, faults, loop
    from meshwise.train.data import Corpus
    from meshwise.train.metrics import MetricsLog

    for name, label in (
        ("local_peak_bytes", "memory peak of the rank"),
        ("_agree_after_step", "peak and stop agreed (all-reduce MAX)"),
        ("peak_memory_bytes", "peak memory (all-reduce MAX)"),  # the names before the one agreement
        ("_stop_requested", "stop agreement (all-reduce MAX)"),
    ):
        if hasattr(loop, name):
            timed(loop, name, label)
    timed(loop, "_save_or_stop", "stop or save")
    timed(checkpoint.Checkpointer, "save", "checkpoint check")
    timed(MetricsLog, "step", "metrics record and log")
    timed(faults, "before_step", "fault hooks")
    timed(loop, "read_step", "loss and norm read (in the step)")
    timed(loop, "lr_at", "learning rate")
    timed(loop, "evaluate", "eval")
    timed(Corpus, "train_rows", "training rows (in the step)")
    timed(ParallelModel, "step", "ParallelModel.step (in the step)")
    original_begin = MetricsLog.begin

    def begin(self, start_step):
        tracked.append(len(gc.get_objects()))
        gc.callbacks.append(on_gc)
        return original_begin(self, start_step)

    MetricsLog.begin = begin
    original_step = MetricsLog.step

    def step(self, *a, **k):
        spent["step_s (train's metric)"].append(a[4])
        return original_step(self, *a, **k)

    MetricsLog.step = step
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    argv = [*DEFAULT, *(a for a in train_args if a != "--")]  # the flags given override the defaults
    if launch.in_torchrun():  # a worker: run it here, and report on rank 0
        command._worker(command.resolve(argv)[1], None, 300.0, watch_parent=True)
    else:
        command.train_main([*argv, "--nproc-per-node", "1"])
    if launch.in_torchrun() and os.environ.get("RANK") != "0":
        return
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
    print(f"objects tracked by the garbage collector when the steps start: {tracked[0]:,}")
    for gen, times in sorted(gc_s.items()):
        print(
            f"gc generation {gen}: {len(times)} collections, {sum(times) * 1e3:.1f} ms in all, "
            f"largest {max(times) * 1e3:.1f} ms"
        )
    print(f"{'part':40} calls   median ms   total ms")
    for label, times in spent.items():
        print(f"{label:40} {len(times):5} {statistics.median(times) * 1e3:11.2f} {sum(times) * 1e3:10.1f}")


if __name__ == "__main__":
    main()
