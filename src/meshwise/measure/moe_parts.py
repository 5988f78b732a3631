"""A mixture-of-experts block's parts, timed alone at a run's shapes: one row of a CPU profile's
``moe_part_table`` (spec/host_keys.py ``MOE_PART_COLUMNS``), which cost/host_moe.py reads before
its own pricing.

The priced parts (operators at the profile's generic cost, the GEMM grid, bytes at the copy
bandwidth) read a small MoE's router, permutation and dispatch / combine 2-6x fast on a 2-core x86
host: its kernels are not generic operators (the router's fp32 softmax and top-k, the stable sort,
``bincount``, the gather ``tokens[order // k]`` whose backward is an index_put with accumulation,
the scatter ``routed[order] = out``, the functional all-to-all's issue and wrappers, the counts'
``.tolist()`` host syncs). So measure/plan_shapes.py's ``top_up`` times the block itself before a
run, at the run's shapes:

- ``ep`` gloo processes, each one rank of the EP group, with the runtime's own block
  (runtime/moe.py ``MoE``: router, experts sharded over the group as runtime/expert_parallel.py
  shards them, the shared expert and its gate where the model has them), in training mode (the
  balancing loss runs), fp32, on ``mbs x tokens / mbs`` random tokens;
- ``WARMUP`` calls, then ``RUNS`` calls forward + backward with the block's part clock
  (runtime/moe.py ``timed_parts``), each after a barrier, and ``RUNS`` forwards alone (what full
  recompute runs again);
- per part the median over the calls, then the mean over the ranks; dispatch / combine less its
  blocking waits on the all-to-alls (``dispatch_host_s``); ``forward_s`` the forward's parts less
  its waits.

The waits are left to the collectives' pricing (cost/experts.py on the calibrated link): they hold
the transfer and whatever the peer was still computing, and on a 2-core x86 host the block alone
waited a median 2.0, 6.7 and 4.6 ms per call in three timings within 20 minutes, where the run's
all-to-alls waited about 3 ms per block call.

With more EP ranks than cores, the ranks time-share the cores: the parts are divided by
``ep / cores`` (a rank's time on a core of its own, as every per-rank figure of a profile;
cost/host.py ``core_share`` multiplies them back for the run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshwise.files import write_atomically
from meshwise.launch import init_process_group, launch_logged
from meshwise.runtime.expert_parallel import apply_expert_parallel
from meshwise.runtime.mesh import end_process_group, exit_worker
from meshwise.runtime.model import MLP
from meshwise.runtime.moe import MoE, timed_parts
from meshwise.spec import load_model
from meshwise.spec.host_keys import MOE_PART_SECONDS, MOE_PART_SHAPE
from meshwise.spec.model import MLP_KINDS

WARMUP, RUNS = 5, 21


def time_parts(key: tuple[float, ...], mbs: int, runs: int = RUNS) -> list[float]:
    """A ``moe_part_table`` row: ``key`` (cost/host_moe.py ``part_key``) and its seconds, the block
    timed over ``ep`` processes on ``mbs`` sequences of the key's tokens (module docstring)."""
    shape = dict(zip(MOE_PART_SHAPE, key))
    ep = int(shape["ep"])
    with tempfile.TemporaryDirectory(prefix="meshwise-moe-parts-") as tmp:
        argv = ["--key", json.dumps(list(key)), "--mbs", str(mbs), "--runs", str(runs), "--out", tmp]
        launch_logged("meshwise.measure.moe_parts", argv, ep, Path(tmp) / "logs", "MoE part timing")
        ranks = [json.loads(f.read_text()) for f in sorted(Path(tmp).glob("rank*.json"))]
    if len(ranks) != ep:
        raise RuntimeError(f"MoE part timing: {len(ranks)} of {ep} ranks wrote their timings")
    share = max(1.0, ep / (os.cpu_count() or 1))
    seconds = {k: statistics.fmean(r[k] for r in ranks) for k in MOE_PART_SECONDS}
    return [*map(float, key), *(v / share for v in seconds.values())]


def build_block(key: tuple[float, ...]):
    """The runtime's MoE block (runtime/moe.py ``MoE``) at ``key``'s shape, weights as the model
    initialises them at small scale, its experts sharded over the default group when ``ep`` > 1."""

    s = {k: int(v) for k, v in zip(MOE_PART_SHAPE, key)}
    spec = dataclasses.replace(
        load_model("tiny-moe"),
        hidden=s["hidden"],
        heads=1,
        kv_heads=1,
        experts=s["experts"],
        experts_per_token=s["top_k"],
        expert_ffn_hidden=s["expert_ffn"],
        shared_ffn_hidden=s["shared_ffn"],
        shared_expert_gate=bool(s["shared_gate"]),
        mlp=MLP_KINDS[s["mlp_kind"]],
        mlp_bias=bool(s["mlp_bias"]),
    )
    torch.manual_seed(0)
    block = MoE(spec, MLP(spec, spec.shared_ffn_hidden) if spec.shared_ffn_hidden else None)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    if s["ep"] > 1:
        apply_expert_parallel(block, init_device_mesh("cpu", (s["ep"],), mesh_dim_names=("ep",)))
    return block.train()


def _one_call(block, x, grad, backward: bool) -> dict[str, float]:
    """One timed call: each part's seconds, dispatch / combine less its blocking waits."""

    if dist.is_initialized():
        dist.barrier()
    with timed_parts() as clock:
        out = block(x)
        if backward:
            out.backward(grad)
    parts = dict(clock.seconds)
    parts["dispatch_host_s"] = parts.pop("dispatch_combine_s") - clock.waits["dispatch_combine_s"]
    return parts


def time_block(block, mbs: int, tokens: int, runs: int) -> dict[str, float]:
    """This rank's ``MOE_PART_SECONDS``: the median of ``runs`` timed calls of each kind."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(mbs, tokens // mbs, block.router.in_features, generator=gen, requires_grad=True)
    grad = torch.randn(x.shape, generator=gen)
    for _ in range(WARMUP):
        _one_call(block, x, grad, True)
    both = [_one_call(block, x, grad, True) for _ in range(runs)]
    forward = [_one_call(block, x, grad, False) for _ in range(runs)]
    out = {k: statistics.median(c[k] for c in both) for k in both[0]}
    out["forward_s"] = statistics.median(sum(c.values()) for c in forward)
    return {k: max(out[k], 0.0) for k in MOE_PART_SECONDS}


def main(argv: list[str] | None = None) -> int:
    """One EP rank: time the block, write ``<out>/rank<r>.json``."""

    ap = argparse.ArgumentParser()
    ap.add_argument("--key", required=True, help="the row's shape (cost/host_moe.py part_key), JSON")
    ap.add_argument("--mbs", type=int, required=True)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    init_process_group("gloo")
    key = tuple(json.loads(args.key))
    block = build_block(key)
    seconds = time_block(block, args.mbs, int(key[0]), args.runs)
    write_atomically(Path(args.out) / f"rank{dist.get_rank()}.json", json.dumps(seconds))
    dist.barrier()
    end_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(main())
