"""meshwise's runtime against a plain torch loop on the same module and micro-batch (CPU, gloo).

At 1 process: the plain model (``build_model``), AdamW, ``clip_grad_norm_``, ``loss.item()`` per
step, against ``parallelize`` with ``dp=1``. At 2 processes: the same loop with ``fully_shard`` on
every block and the root (ZeRO-3), against meshwise's ``dp=2,zero=3``. Both use the whole global
batch as one micro-batch (no accumulation), the same AdamW settings and the same clipping.

The two runs live in the same processes and alternate: each round times ``--steps`` steps of one,
then of the other (the order swaps every round), after one untimed step each. A round's time per
step is the slowest rank's. Printed: min / median / max ms per step of each, and the ratio
meshwise speed / plain speed = plain median / meshwise median (>= 1: meshwise is as fast), and the
same for the minima (less sensitive to other work on a shared machine).

A benchmark that prints, not a test: the figures depend on what else runs on the machine.

    .venv/bin/python benchmarks/vs_torch.py [--model small] [--seq 128] [--batch 8] [--rounds 3] [--steps 5]
                                            [--worlds 1,2] [--threads N] > benchmarks/results/vs-torch-cpu2core.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshwise.launch import free_port
from meshwise.layout import parse
from meshwise.runtime import OptimizerConfig, build_mesh, build_model, loss_sum, parallelize
from meshwise.spec import load_model

CORES = os.cpu_count() or 1


def fully_shard_blocks(model: torch.nn.Module, world: int) -> None:
    """torch's own FSDP2 on ``world`` CPU ranks: ``fully_shard`` (ZeRO-3) of every block, then the root
    (the plain loops of this file and of train_vs_torchrun.py)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def plain_runner(spec, world: int, cfg: OptimizerConfig, seed: int):
    """The plain loop's step: fully_shard (ZeRO-3) per block and root when world > 1."""
    model = build_model(spec, seed)
    if world > 1:
        fully_shard_blocks(model, world)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_sum(model(x), y) / y.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return loss.item()

    return step


def meshwise_runner(spec, world: int, batch: int, seq: int, cfg: OptimizerConfig, seed: int):
    mbs = batch // world  # no accumulation, as in the plain loop
    layout = parse(f"dp=1,mbs={mbs}" if world == 1 else f"dp={world},zero=3,mbs={mbs}", world)
    mesh = build_mesh(layout, spec, batch)
    pm = parallelize(spec, layout, mesh, batch, seq_len=seq, seed=seed, optim=cfg)
    return lambda x, y: pm.step(x, y)[0].item()  # the loss read per step, as the plain loop does


def timed(step, x, y, steps: int) -> float:
    """Seconds per step of the slowest rank."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    t = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(args.threads or max(1, CORES // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    spec = load_model(args.model)
    cfg = OptimizerConfig()
    rows = args.batch // world
    gen = torch.Generator().manual_seed(1234)
    data = torch.randint(0, spec.vocab, (args.batch, args.seq + 1), generator=gen)
    x, y = data[rank * rows : (rank + 1) * rows, :-1], data[rank * rows : (rank + 1) * rows, 1:]
    runs = {
        "plain torch": plain_runner(spec, world, cfg, 0),
        "meshwise": meshwise_runner(spec, world, args.batch, args.seq, cfg, 0),
    }
    for step in runs.values():
        step(x, y)  # untimed
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(timed(runs[name], x, y, args.steps))
    if rank == 0:
        out.put(times)
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    times = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--threads", type=int, default=0, help="threads per process (default: cores / processes)")
    args = ap.parse_args()
    print(
        f"{args.model}, global batch {args.batch} x {args.seq} tokens, one micro-batch per rank, "
        f"{args.rounds} interleaved rounds of {args.steps} steps, load average {os.getloadavg()[0]:.1f}"
    )
    for world in map(int, args.worlds.split(",")):
        times = measure(world, args)
        print(
            f"{world} process(es), {args.threads or max(1, CORES // world)} thread(s) each: ms/step min / median / max"
        )
        for name, ts in times.items():
            ms = sorted(t * 1e3 for t in ts)
            print(f"  {name:12s} {ms[0]:8.1f} {statistics.median(ms):8.1f} {ms[-1]:8.1f}")
        ratio = statistics.median(times["plain torch"]) / statistics.median(times["meshwise"])
        best = min(times["plain torch"]) / min(times["meshwise"])
        print(f"  meshwise speed / plain torch speed: {ratio:.3f} (medians), {best:.3f} (minima)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
