"""``meshwise calibrate``: microbenchmark the machine it runs on into an accelerator profile.

One launch (``meshwise.launch``: torch's elastic launcher) of ``N`` local processes (gloo, one thread each, as ``meshwise measure`` and
``meshwise train`` run on CPU); every rank measures at once, so shared cores and memory bandwidth
are measured as the training run will see them, and the slowest rank's figure is kept:

- **matmul rate** ``peak_*_flops_per_s``: the GEMMs of one block (Q, K, V, output projection,
  gate, up, down) at ``T = mbs * seq`` tokens in the training dtype (fp32 on CPU),
  ``sum(2 T k n) / time``;
- **achieved efficiency** ``efficiency_max``: one single-process forward + backward of the whole
  model on ``T`` tokens, less its host time (below), over ``time * matmul rate``;
  ``efficiency_half_width = 0`` so the cost model reads ``efficiency(h) = efficiency_max`` for
  every hidden size (the curve was fitted on GPUs; one CPU point cannot fit a curve);
- **host time** ``op_overhead_s``, ``checkpoint_call_s``, ``selective_op_s`` (cost/host.py): one
  forward + backward of the model on ``HOST_TOKENS`` tokens, where the arithmetic is negligible, under
  each activation-checkpointing mode: ``t_none / ops``, then ``(t_full - t_none) / blocks - F * op``
  and ``((t_sel - t_none) / blocks - F * op - call) / (2 F)``, never below 0;
- **achieved efficiency** is then the arithmetic's alone: ``model_flops / ((fwd_bwd_s - ops *
  op_overhead_s) * matmul rate)``;
- **DTensor** ``tp_op_s`` (two processes): the same forward + backward with the model under tp=2
  (the runtime's own TP/SP plan), less the plain one and the TP collectives' latency
  (``collectives * alpha``, the fitted latency), per operator; 0 when not measured;
- **threads** ``thread_efficiency``: rank 0's matmul rate with all cores' threads while the others
  wait, ``(rate_C / rate_1 - 1) / (C - 1)`` (0 < it <= 1), so the planner can weigh one process
  with all cores against one process per core;
- **memory bandwidth** ``hbm_bytes_per_s``: a large tensor copy, ``2 * bytes / time`` (read +
  write, as the cost model's optimizer term counts its bytes);
- **collectives** ``intra_/inter_bytes_per_s`` and ``_latency_s``: all-reduce, all-gather and
  reduce-scatter at a few sizes, fitted to the cost model's formulas (``cost/comm.py``): ring
  all-reduce ``2(n-1) alpha + 2(n-1)/n B / beta``, all-gather and reduce-scatter
  ``(n-1) alpha + (n-1)/n B / beta``, by least squares on relative error. Each call is timed as
  training issues it, between two slices of compute: ``(time of compute + call) - (time of the
  compute alone)``. Back-to-back calls in a tight loop read several times faster on CPU, because
  there gloo's threads and the peer process are already awake; in training they are not (and the
  ranks' compute is never perfectly in step). One machine is one node: ``inter`` = ``intra``.
- **overlap** ``comm_overlap = false``: a CPU rank computes on all its cores and gloo's transfers
  need those cores, so the cost model exposes data-parallel communication instead of hiding it.

``memory_bytes`` is a per-rank share of physical memory: ``0.8 * RAM / N``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshwise.errors import MeshwiseError
from meshwise.files import check_output_file, write_atomically
from meshwise.launch import launch_logged
from meshwise.spec import ModelSpec, load_model

DEFAULT_OUT = "meshwise-profile.toml"
MEMORY_SHARE = 0.8  # fraction of physical memory the ranks may use together
COLLECTIVE_SIZES_BYTES = (4 << 10, 256 << 10, 4 << 20)
COPY_BYTES = 128 << 20
HOST_TOKENS = 4  # tokens of the host-time benchmark: few enough that the arithmetic is negligible
PROFILE_KEYS = ("name", "memory_bytes", "peak_bf16_flops_per_s", "peak_fp32_flops_per_s", "hbm_bytes_per_s",
                "gpus_per_node", "intra_bytes_per_s", "intra_latency_s", "inter_bytes_per_s", "inter_latency_s",
                "efficiency_max", "efficiency_half_width", "comm_overlap", "op_overhead_s", "checkpoint_call_s",
                "selective_op_s", "tp_op_s", "thread_efficiency", "source")


# ----------------------------------------------------------------------------- pure arithmetic
def collective_coefficients(kind: str, n: int, payload_bytes: float) -> tuple[float, float]:
    """(latency steps, bytes over the link) of one call, so that ``t = steps * alpha + bytes / beta``
    (cost/comm.py's ring formulas; ``payload_bytes`` is the full tensor, gathered for all-gather)."""
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * payload_bytes
    if kind in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n * payload_bytes
    raise ValueError(f"unknown collective kind {kind!r}")


def fit_alpha_beta(samples: list[tuple[str, int, float, float]]) -> tuple[float, float]:
    """(latency_s, bytes_per_s) fitted to ``(kind, n, payload_bytes, seconds)`` samples.

    Minimises ``sum(((steps * alpha + bytes * g) - t) / t)^2`` over ``alpha >= 0`` and
    ``g = 1 / beta > 0``: relative error, so the small messages fix the latency and the large ones
    the bandwidth. A 2 x 2 normal-equation solve; a negative alpha is refitted as 0.
    """
    rows = []
    for kind, n, payload, seconds in samples:
        if seconds <= 0:
            raise ValueError(f"non-positive time {seconds} for {kind} of {payload} bytes")
        steps, moved = collective_coefficients(kind, n, payload)
        rows.append((steps / seconds, moved / seconds))
    if not rows:
        raise ValueError("no collective samples to fit")
    saa = sum(a * a for a, _ in rows)
    sab = sum(a * b for a, b in rows)
    sbb = sum(b * b for _, b in rows)
    sa = sum(a for a, _ in rows)
    sb = sum(b for _, b in rows)
    det = saa * sbb - sab * sab
    alpha = (sa * sbb - sb * sab) / det if det > 0 else -1.0
    g = (saa * sb - sab * sa) / det if det > 0 else -1.0
    if alpha < 0 or g <= 0:
        alpha, g = 0.0, sb / sbb  # bandwidth only
    return alpha, 1.0 / g


def profile_table(result: dict[str, Any], nproc: int, ram_bytes: int, name: str = "cpu-calibrated") -> dict[str, Any]:
    """The profile (catalog/accelerators.toml's keys) from the workers' ``result``:
    ``matmul_flops_per_s``, ``fwd_bwd_s``, ``model_flops``, ``copy_bytes_per_s``, ``collectives``
    (``[kind, n, payload_bytes, seconds]`` lists) and ``what`` (a description)."""
    if nproc > 1:
        latency_s, link_bytes_per_s = fit_alpha_beta([tuple(s) for s in result["collectives"]])
        link_note = "collectives (all-reduce, all-gather, reduce-scatter between compute slices) fitted over gloo"
    else:  # one process: nothing to measure; a copy through shared memory stands in
        latency_s, link_bytes_per_s = 1e-6, float(result["copy_bytes_per_s"])
        link_note = "one process: links not measured (copy bandwidth, 1 us)"
    peak = float(result["matmul_flops_per_s"])
    model_ops = int(result["model_ops"])
    op_s, call_s, sel_s = host_constants(result["host_s"], model_ops, int(result["blocks"]))
    arithmetic_s = max(float(result["fwd_bwd_s"]) - model_ops * op_s, 0.5 * float(result["fwd_bwd_s"]))
    efficiency = min(1.0, float(result["model_flops"]) / (arithmetic_s * peak))
    tp_s = 0.0
    if result.get("tp_host_s") and nproc > 1:
        tp_calls = int(result["tp_collectives"])
        tp_s = max(0.0, (float(result["tp_host_s"]) - float(result["host_s"]["none"]) - tp_calls * latency_s) / model_ops)
    cores = int(result.get("cores", 1))
    rate_all = float(result.get("matmul_all_threads_flops_per_s", peak))
    thread_eff = 1.0 if cores < 2 else min(1.0, max(0.05, (rate_all / peak - 1) / (cores - 1)))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "name": name,
        "memory_bytes": int(MEMORY_SHARE * ram_bytes / nproc),
        "peak_bf16_flops_per_s": peak,
        "peak_fp32_flops_per_s": peak,
        "hbm_bytes_per_s": float(result["copy_bytes_per_s"]),
        "gpus_per_node": nproc,
        "intra_bytes_per_s": link_bytes_per_s,
        "intra_latency_s": latency_s,
        "inter_bytes_per_s": link_bytes_per_s,
        "inter_latency_s": latency_s,
        "efficiency_max": efficiency,
        "efficiency_half_width": 0.0,
        "comm_overlap": False,
        "op_overhead_s": op_s,
        "checkpoint_call_s": call_s,
        "selective_op_s": sel_s,
        "tp_op_s": tp_s,
        "thread_efficiency": thread_eff,
        "source": f"meshwise calibrate, {when}: {result['what']}; {link_note}; "
                  f"memory_bytes = {MEMORY_SHARE} x RAM / {nproc}",
    }


def host_constants(host_s: dict[str, float], model_ops: int, blocks: int) -> tuple[float, float, float]:
    """(op_overhead_s, checkpoint_call_s, selective_op_s) from the forward + backward seconds of the
    host benchmark under each mode (``{"none": t, "full": t, "selective": t}``), by cost/host.py's
    model: none = ops * op; full adds blocks * (F * op + call); selective adds
    blocks * (F * op + call + 2 F * sel). Each is at least 0."""
    from meshwise.cost.host import BLOCK_FORWARD_OPS as F

    op = host_s["none"] / model_ops
    call = max(0.0, (host_s["full"] - host_s["none"]) / blocks - F * op)
    sel = max(0.0, ((host_s["selective"] - host_s["none"]) / blocks - F * op - call) / (2 * F))
    return op, call, sel


def format_toml(table: dict[str, Any]) -> str:
    """The profile as TOML, keys in catalog order (strings JSON-escaped: valid TOML basic strings)."""
    lines = ["# An accelerator profile measured by `meshwise calibrate`; use it as `meshwise plan --gpu FILE`."]
    for key in PROFILE_KEYS:
        value = table[key]
        if isinstance(value, bool):
            lines.append(f"{key} = {str(value).lower()}")
        elif isinstance(value, str):
            lines.append(f"{key} = {json.dumps(value)}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {value:.6g}" if value != 0 else f"{key} = 0.0")
    return "\n".join(lines) + "\n"


def write_profile(path: str | Path, table: dict[str, Any]) -> None:
    """Write atomically: a temporary file beside ``path``, then a rename."""
    write_atomically(path, format_toml(table))


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------------------ orchestration
def check_args(nproc: int, out: str, seq_len: int | None, model: ModelSpec) -> int:
    """Refuse bad input in one line before anything starts; returns the sequence length."""
    if nproc < 1:
        raise MeshwiseError(f"--nproc-per-node: {nproc} must be at least 1")
    if not out.endswith(".toml"):
        raise MeshwiseError(f"--out: {out!r} must end in .toml (plan --gpu reads a profile by that suffix)")
    check_output_file("--out", out, parent_must_exist=True)
    seq = seq_len if seq_len is not None else model.max_seq
    if not 1 <= seq <= model.max_seq:
        raise MeshwiseError(f"--seq-len: {seq} must be in [1, {model.max_seq}] (the model's max_seq)")
    return seq


def calibrate(nproc: int = 2, model_ref: str = "small", out: str = DEFAULT_OUT, seq_len: int | None = None,
              quick: bool = False) -> dict[str, Any]:
    """Measure with ``nproc`` local gloo processes, write the profile to ``out``; returns its table.
    ``quick``: fewer repetitions and smaller tensors (tests)."""
    model = load_model(model_ref)
    if model.states_only:
        raise MeshwiseError("--model: calibration needs a model shape, not a bare parameter count")
    seq = check_args(nproc, out, seq_len, model)
    with tempfile.TemporaryDirectory(prefix="meshwise-calibrate-") as tmp:
        argv = ["--model", model_ref, "--seq-len", str(seq), "--out", tmp] + (["--quick"] if quick else [])
        launch_logged("meshwise.measure.calibrate", argv, nproc, Path(tmp) / "logs", "calibration workers")
        result_file = Path(tmp) / "result.json"
        if not result_file.is_file():
            raise RuntimeError("calibration workers wrote no result")
        result = json.loads(result_file.read_text())
    table = profile_table(result, nproc, physical_memory_bytes())
    write_profile(out, table)
    return table


# ------------------------------------------------------------------------- worker (torch side)
def _best_time(fn, repeats: int, min_s: float = 0.0) -> float:
    """Shortest of ``repeats`` timings of ``fn`` (each run at least once, repeated to ``min_s``)."""
    best = math.inf
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        best = min(best, elapsed / calls)
    return best


def block_gemm_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of each matmul of one block: Q, K, V, output projection, then the MLP's."""
    h, kv, f = model.hidden, model.kv_dim, model.ffn_hidden
    mlp = [(h, f), (h, f), (f, h)] if model.mlp == "swiglu" else [(h, f), (f, h)]
    return [(h, h), (h, kv), (h, kv), (h, h)] + mlp


def bench_matmul(model: ModelSpec, tokens: int, repeats: int) -> float:
    """FLOP/s of one block's GEMMs at ``tokens`` tokens, fp32."""
    import torch

    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(tokens, k, generator=gen), torch.randn(n, k, generator=gen))
             for k, n in block_gemm_shapes(model)]
    flops = sum(2.0 * tokens * w.shape[0] * w.shape[1] for _, w in pairs)

    def run() -> None:
        for x, w in pairs:
            torch.nn.functional.linear(x, w)

    run()
    return flops / _best_time(run, repeats, min_s=0.05)


def bench_forward_backward(model: ModelSpec, seq: int, repeats: int) -> float:
    """Seconds of one forward + backward of the whole model on one sequence of ``seq`` tokens."""
    import torch

    from meshwise.runtime.model import build_model, loss_sum

    net = build_model(model, seed=0)
    tokens = torch.randint(0, model.vocab, (1, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def run() -> None:
        net.zero_grad(set_to_none=True)
        loss_sum(net(x), y).backward()

    run()
    return _best_time(run, repeats)


def bench_host(model: ModelSpec, repeats: int) -> dict[str, float]:
    """Seconds of one forward + backward on ``HOST_TOKENS`` tokens under each checkpointing mode
    (the runtime's own wrappers): host time, the arithmetic being negligible."""
    import torch

    from meshwise.runtime.activation_checkpointing import apply_activation_checkpointing
    from meshwise.runtime.model import build_model, loss_sum

    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    out: dict[str, float] = {}
    for mode in ("none", "full", "selective"):
        net = build_model(model, seed=0)
        apply_activation_checkpointing(net, mode)

        def run() -> None:
            net.zero_grad(set_to_none=True)
            loss_sum(net(x), y).backward()

        run()
        out[mode] = _best_time(run, repeats, min_s=0.05)
    return out


def runs_tp2(model: ModelSpec) -> bool:
    """Whether ``model`` splits over tp=2 (heads, KV heads, MLP width and vocabulary even)."""
    return all(x % 2 == 0 for x in (model.heads, model.kv_heads, model.ffn_hidden, model.vocab))


def bench_tp_host(model: ModelSpec, repeats: int, calls: int = 5) -> tuple[float, int]:
    """(seconds of one forward + backward on ``HOST_TOKENS`` tokens of ``model`` under tp=2 on
    two ranks, the TP collectives one such micro-batch issues). A fixed number of calls between
    barriers: both ranks must issue the same collectives."""
    import torch

    from meshwise.layout import parse
    from meshwise.measure.comm_trace import CollectiveTrace
    from meshwise.runtime import build_mesh, parallelize
    from meshwise.runtime.model import loss_sum

    layout = parse("tp=2", 2)
    mesh = build_mesh(layout, model, 1)
    net = parallelize(model, layout, mesh, 1, seq_len=HOST_TOKENS, seed=0).modules[0]
    tokens = torch.randint(0, model.vocab, (1, HOST_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def run() -> None:
        net.zero_grad(set_to_none=True)
        loss_sum(net(x), y).backward()

    with CollectiveTrace(mesh) as trace:
        run()
    return _lockstep_time(run, repeats, calls), sum(trace.calls.values())


def _lockstep_time(fn, repeats: int, calls: int) -> float:
    """Seconds per call of ``fn``: the best of ``repeats`` runs of ``calls`` calls, every rank
    starting each run at a barrier (a fixed count: ranks must issue the same collectives)."""
    import torch.distributed as dist

    best = math.inf
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / calls


def bench_copy(nbytes: int, repeats: int) -> float:
    """Bytes per second read + written by a tensor copy of ``nbytes``."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2.0 * nbytes / _best_time(lambda: dst.copy_(src), repeats)


def bench_collectives(model: ModelSpec, tokens: int, sizes: tuple[int, ...], calls: int,
                      repeats: int) -> list[list[float]]:
    """``[kind, n, payload_bytes, seconds]`` per kind and size. Each call follows a slice of compute
    (one block's GEMMs at ``tokens`` tokens), as in training; seconds per call =
    ``(min time of calls x (compute + call) - min time of calls x compute) / calls``, at least the
    tight-loop time of the call alone."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(tokens, k, generator=gen), torch.randn(m, k, generator=gen))
             for k, m in block_gemm_shapes(model)]

    def compute() -> None:
        for x, w in pairs:
            torch.nn.functional.linear(x, w)

    def loop(op) -> float:
        return _lockstep_time(op, repeats, calls)

    compute_s = loop(compute)
    out: list[list[float]] = []
    for nbytes in sizes:
        numel = max(n, nbytes // 4 // n * n)
        full = torch.ones(numel)
        shard = torch.ones(numel // n)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}
        for kind, op in ops.items():
            op()
            alone_s = loop(op)
            between_s = loop(lambda: (compute(), op())) - compute_s
            out.append([kind, n, float(numel * 4), max(alone_s, between_s)])
    return out


def worker_main(argv: list[str] | None = None) -> int:
    """One rank: every benchmark at once on every rank; rank 0 writes ``<out>/result.json`` with the
    slowest rank's figures (lowest rates, longest times)."""
    import argparse

    import torch
    import torch.distributed as dist

    from meshwise.cost.compute import model_flops
    from meshwise.cost.host import ops_per_microbatch
    from meshwise.launch import init_process_group
    from meshwise.runtime.mesh import end_process_group

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.model)
    repeats = 2 if args.quick else 3
    init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    mine = {"matmul_flops_per_s": bench_matmul(model, args.seq_len, repeats)}
    dist.barrier()
    mine["fwd_bwd_s"] = bench_forward_backward(model, args.seq_len, repeats)
    dist.barrier()
    mine["copy_bytes_per_s"] = bench_copy(COPY_BYTES // (16 if args.quick else 1), repeats)
    dist.barrier()
    mine["host_s"] = bench_host(model, repeats)
    dist.barrier()
    tp = bench_tp_host(model, repeats) if n == 2 and runs_tp2(model) else (0.0, 0)
    dist.barrier()
    cores = os.cpu_count() or 1
    if rank == 0 and cores > 1:  # one process with every core's thread, the others waiting
        torch.set_num_threads(cores)
        mine["matmul_all_threads_flops_per_s"] = bench_matmul(model, args.seq_len, repeats)
        torch.set_num_threads(1)
    dist.barrier()
    sizes = COLLECTIVE_SIZES_BYTES[:2] if args.quick else COLLECTIVE_SIZES_BYTES
    collectives = (bench_collectives(model, args.seq_len, sizes, calls=3 if args.quick else 8, repeats=repeats)
                   if n > 1 else [])
    everyone: list[dict] = [{} for _ in range(n)]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        result = {
            "matmul_flops_per_s": min(r["matmul_flops_per_s"] for r in everyone),
            "fwd_bwd_s": max(r["fwd_bwd_s"] for r in everyone),
            "copy_bytes_per_s": min(r["copy_bytes_per_s"] for r in everyone),
            "model_flops": model_flops(model, args.seq_len, args.seq_len),
            "model_ops": ops_per_microbatch(model.layers, True, True),
            "blocks": model.layers,
            "host_s": {k: max(r["host_s"][k] for r in everyone) for k in everyone[0]["host_s"]},
            "cores": cores,
            "tp_host_s": tp[0],
            "tp_collectives": tp[1],
            "matmul_all_threads_flops_per_s": everyone[0].get("matmul_all_threads_flops_per_s",
                                                             everyone[0]["matmul_flops_per_s"]),
            "collectives": collectives,
            "what": (f"{n} gloo process(es) x 1 thread on {platform.machine()} ({os.cpu_count()} cores), "
                     f"torch {torch.__version__}, fp32 GEMMs of {model.name} at {args.seq_len} tokens"),
        }
        write_atomically(Path(args.out) / "result.json", json.dumps(result))
    dist.barrier()
    end_process_group()
    return 0


if __name__ == "__main__":
    from meshwise.runtime.mesh import exit_worker

    exit_worker(worker_main())
