"""Train the catalog's ``tiny`` model under any layout, on CPU or GPU, with meshwise's runtime.

    torchrun --nproc-per-node 4 examples/parallelize_tiny.py                      # dp=4 (DDP-like)
    torchrun --nproc-per-node 4 examples/parallelize_tiny.py --layout dp=2,zero=3,tp=2
    torchrun --nproc-per-node 4 examples/parallelize_tiny.py --layout pp=2,dp=2,zero=1,ac=selective

The layout is checked against the model, the world size and the batch before any process group
exists; a bad one is refused with a one-line message (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import meshwise
from meshwise.errors import MeshwiseError
from meshwise.layout import parse
from meshwise.spec import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="", help="e.g. dp=2,zero=3,tp=2 (dp defaults to world/(tp*pp))")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--global-batch", type=int, default=8, help="sequences per optimizer step")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    spec = load_model(args.model)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        layout = parse(args.layout, world)
        mesh = meshwise.build_mesh(layout, spec, args.global_batch)  # validates, then process groups
    except MeshwiseError as err:
        print(f"meshwise: {err}", file=sys.stderr)
        return 2
    model = meshwise.parallelize(spec, layout, mesh, args.global_batch, seed=0)
    if dist.get_rank() == 0:
        print(
            f"{spec.describe()}\nlayout {layout.short()}: {model.accum} micro-batches per step, "
            f"chunks {model.chunk_ids} on rank 0"
        )
    gen = torch.Generator().manual_seed(0)  # same data on every rank; each replica takes its rows
    for step in range(args.steps):
        tokens = torch.randint(0, spec.vocab, (args.global_batch, spec.max_seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        loss, grad_norm = model.step(model.local_batch(inputs), model.local_batch(targets))  # tensors
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.6f}  grad norm {grad_norm.item():.4f}")
    meshwise.end_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
