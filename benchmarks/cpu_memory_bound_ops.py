"""How fast this CPU runs the runtime's memory-bound operations, against the copy bandwidth the
calibration measures (``hbm_bytes_per_s``), by the bytes the cost model charges for them.

One process, one thread. For the cpu_time_fidelity model's shapes (hidden 256, MLP 704, vocabulary
256, fp32) at ``--tokens`` tokens (default 2048: a tp=2 rank's micro-batch of 8 x 256), each of the
runtime's own operations forward + backward (``Norm`` = ``F.rms_norm``, a residual add, SwiGLU's
``silu(gate) * up``, ``loss_sum``), best of repeated calls, and the bytes cost/kernels.py's
``PASSES["meshwise"]`` charges for it (backward twice the forward; the loss ``loss_bytes`` per
logit): the effective bandwidth, bytes / seconds. Beside them a tensor copy as calibrate times it
(``2 * bytes / time``) at the calibration's quick size (8 MiB) and full size (128 MiB).

    flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/cpu_memory_bound_ops.py   # ~10 s
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from meshwise.cost.kernels import PASSES

HIDDEN, FFN, VOCAB, E = 256, 704, 256, 4


def best(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def fwd_bwd(make, *shapes):
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=gen, requires_grad=True) for s in shapes]

    def run() -> None:
        for x in inputs:
            x.grad = None
        make(*inputs).sum().backward() if make is not None else None

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    t = ap.parse_args().tokens
    torch.set_num_threads(1)
    p = PASSES["meshwise"]
    weight = torch.ones(HIDDEN, requires_grad=True)
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(0, VOCAB, (t,), generator=gen)
    cases = [
        (
            "rms_norm",
            fwd_bwd(lambda x: F.rms_norm(x, (HIDDEN,), weight, 1e-5), (t, HIDDEN)),
            3 * p["norm"] * t * HIDDEN * E,
        ),
        ("residual add", fwd_bwd(lambda a, b: a + b, (t, HIDDEN), (t, HIDDEN)), 3 * p["residual"] * t * HIDDEN * E),
        ("swiglu", fwd_bwd(lambda g, u: F.silu(g) * u, (t, FFN), (t, FFN)), 3 * p["swiglu"] * t * FFN * E),
        (
            "loss",
            fwd_bwd(lambda z: F.cross_entropy(z.float(), targets, reduction="sum"), (t, VOCAB)),
            p["loss_bytes"] * t * VOCAB,
        ),
    ]
    print(f"{t} tokens, 1 thread; bytes as cost/kernels.py PASSES['meshwise'] charges forward + backward")
    for name, run, moved in cases:
        s = best(run)
        print(f"  {name:<13} {s * 1e3:7.3f} ms  {moved / 1e6:7.2f} MB  {moved / s / 1e9:6.2f} GB/s")
    for size in (8 << 20, 128 << 20):
        src, dst = torch.empty(size // 4), torch.empty(size // 4)
        s = best(lambda: dst.copy_(src), 10)
        print(
            f"  copy {size >> 20:>4} MiB {s * 1e3:7.3f} ms  {2 * size / s / 1e9:6.2f} GB/s (2 x bytes / time, as calibrate)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
