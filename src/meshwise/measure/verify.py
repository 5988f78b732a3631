"""``meshwise verify``: any rank of any layout, at its real world size, traced through one training
step on fake devices (:mod:`meshwise.measure.verify_worker`) and printed beside the plan's prediction in
``measure``'s rows.

Depth. A rank's blocks are identical, so every traced figure (memory by category at the peak,
collective bytes and counts) is an affine function of the blocks it holds, n, once the step's
peak falls at the same moment whatever the depth:
f(n) = f(n1) + (f(n2) - f(n1)) * (n - n1) / (n2 - n1). ``--depth auto`` traces the model cut to
REDUCED = (3, 4) blocks per pipeline chunk (n1 = 3 * vpp, n2 = 4 * vpp blocks on every rank) and
extrapolates to the rank's own n; ``--depth full`` traces the real depth (tests/integration/test_verify_traces.py
checks one against the other on a small model). With one or two blocks per chunk the peak can
fall elsewhere (the head's backward outweighs the blocks), so fewer than three are not used.
Where a category shrinks from the first trace to the second, the peak fell at different moments
of the step, and the pair moves up one block per chunk until it does not (or reaches the real depth).
A rank with no more than 4 * vpp blocks is traced at its real depth. Only where a rank's chunks differ in size (the
layers do not split evenly) does the extrapolation of activations assume a mean block per chunk.

Figures beside the plan: the rows of :func:`meshwise.measure.compare.rows_for` (memory.params,
grads, optimizer, activations, other; comm.<kind>.<dim>.bytes_per_step and count_per_step), plus
``memory.states`` (params + grads + optimizer) and ``memory.total``, what decides the fit. The
memory at the peak is categorised by what each storage is, not by when it was made
(measure/_torch_tools.RoleMemTracker): FSDP2's gathered weights are params, its sharded, unsharded
and float32-accumulated gradients grads, the float32 master shard under bf16-mixed and the
optimizer's states optimizer, FSDP2's collective buffers and the modules' buffers other, and what
the forward and backward made that nothing of those holds activations. MemTracker's own split (by
when a storage was made: gathered weights in forward as activations, accumulators in backward as
temporaries) stays in the record as ``memory_by_creation``.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable, parse, rank_chunks, stage_layers
from meshwise.measure import fake_cuda
from meshwise.measure.command import print_rows
from meshwise.measure.compare import MEMORY, Row, measured_memory, rows_for
from meshwise.measure.rank_trace import RankTrace
from meshwise.spec import ClusterSpec, ModelSpec, TrainSpec, default_seq_len, load_cluster, load_model

DEPTHS = ("auto", "full")
REDUCED = (3, 4)  # blocks per chunk of the two reduced-depth traces


def check_model_runs(model: ModelSpec, seq: int) -> None:
    """What the runtime refuses to build (mixture of experts, latent attention...), refused here
    before anything is traced, in the runtime's own words (runtime.model.runtime_refusal)."""
    from meshwise.runtime.model import runtime_refusal  # torch: imported once plan's or verify's flags are checked

    refusal = runtime_refusal(model, seq)
    if refusal:
        raise MeshwiseError(refusal)
    if not model.states_only and model.sliding_window and model.sliding_window < seq:
        raise MeshwiseError(
            f"model {model.name!r}: its {model.sliding_window}-token sliding window runs SDPA with a "
            "mask, which on fake devices is the math kernel (it keeps the s x s scores a GPU's "
            f"kernel does not): not traced; use --seq-len {model.sliding_window} or less"
        )


def device_type(cluster: ClusterSpec) -> str:
    """The device the runtime would run on: cuda for GPU profiles, cpu for CPU ones (no overlap)."""
    return "cuda" if cluster.accelerator.comm_overlap else "cpu"


def runtime_precision(kind: str) -> str:
    """What the runtime trains in on ``kind`` (docs/runtime.md): bf16-mixed on GPU, fp32 on CPU."""
    return "bf16-mixed" if kind == "cuda" else "fp32"


def float8_precision(train: TrainSpec) -> str | None:
    """The float8 format the trace runs (meshwise.runtime.float8), or None for the device's own."""
    from meshwise.runtime.float8 import RECIPES  # torch: imported once plan's or verify's flags are checked

    return train.precision if train.precision in RECIPES else None


def trace_precision(precision: str, kind: str) -> str:
    """The precision a trace on ``kind`` runs for a requested one: the runtime's own for ``auto``;
    a float8 format the runtime trains (refused in one line otherwise, never traced in another)."""
    from meshwise.runtime import float8  # torch: imported once plan's or verify's flags are checked

    return float8.resolve(precision, kind) or runtime_precision(kind)


def verify_train(cluster: ClusterSpec, global_batch: int, seq: int, precision: str = "auto") -> TrainSpec:
    """The step ``verify`` traces and predicts: the runtime's precision on the cluster's device (or
    the float8 format asked for, :func:`trace_precision`), the rest ``plan``'s defaults (so its
    predicted column is ``plan --json``'s for the same layout)."""
    return TrainSpec(global_batch=global_batch, seq_len=seq, precision=trace_precision(precision, device_type(cluster)))


def auto_ranks(layout: Layout) -> list[int]:
    """One rank per distinct shape: the first, a middle and the last pipeline stage (coordinate 0
    on every other dimension); one rank without PP."""
    per_stage = layout.world_size // layout.pp
    return [s * per_stage for s in sorted({0, layout.pp // 2, layout.pp - 1})]


def parse_ranks(text: str, layout: Layout) -> list[int]:
    if text == "auto":
        return auto_ranks(layout)
    try:
        ranks = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise MeshwiseError(f"--ranks: {text!r} must be 'auto' or comma-separated ranks, e.g. 0,63") from None
    bad = [r for r in ranks if not 0 <= r < layout.world_size]
    if not ranks or bad:
        raise MeshwiseError(
            f"--ranks: {bad[0] if bad else text!r} is not a rank of the world (0..{layout.world_size - 1})"
        )
    return ranks


def rank_blocks(model: ModelSpec, layout: Layout, pp_rank: int) -> int:
    counts = stage_layers(model.layers, layout.stages)
    return sum(counts[c] for c in rank_chunks(pp_rank, layout.pp, layout.vpp, layout.schedule))


MEMORY_FIELDS = ("memory", "memory_by_creation")  # by what a storage is; by when MemTracker saw it made


def _figures(record: dict) -> dict[str, float]:
    out = {f"{field}:{k}": float(v) for field in MEMORY_FIELDS for k, v in record.get(field, {}).items()}
    for c in record["comm"]:
        out[f"comm:{c['kind']}:{c['dim']}:count"] = float(c["count_per_step"])
        out[f"comm:{c['kind']}:{c['dim']}:bytes"] = float(c["bytes_per_step"])
    return out


def extrapolate(a: dict, b: dict, n_a: int, n_b: int, n: int) -> dict:
    """The record at ``n`` blocks from records at ``n_a`` and ``n_b`` blocks (affine in blocks)."""
    fa, fb = _figures(a), _figures(b)
    f = {k: fa.get(k, 0.0) + (fb.get(k, 0.0) - fa.get(k, 0.0)) * (n - n_a) / (n_b - n_a) for k in set(fa) | set(fb)}
    out = dict(b)
    for field in MEMORY_FIELDS:
        if field in b:
            out[field] = {k.split(":", 1)[1]: round(v) for k, v in f.items() if k.startswith(f"{field}:")}
    comm = {}
    for k, v in f.items():
        if k.startswith("comm:"):
            _, kind, dim, what = k.split(":")
            comm.setdefault((kind, dim), {"kind": kind, "dim": dim})[
                "count_per_step" if what == "count" else "bytes_per_step"
            ] = round(v)
    out["comm"] = [comm[k] for k in sorted(comm)]
    out["blocks"] = n
    return out


def trace_record(target: RankTrace, depth: str) -> dict:
    """``target``'s traced record at the model's real depth (traced, or extrapolated; see above)."""
    model, layout = target.model, target.layout
    pp_rank = target.rank // (layout.world_size // layout.pp)
    n = rank_blocks(model, layout, pp_rank)
    if depth == "full" or n <= REDUCED[1] * layout.vpp:
        record = trace_rank(target)
        record["blocks"] = n
        return record

    def at(k: int) -> dict:
        return trace_rank(dataclasses.replace(target, model=dataclasses.replace(model, layers=k * layout.stages)))

    k1, k2 = REDUCED
    a, b = at(k1), at(k2)
    while _peak_moved(a, b) and (k2 + 1) * layout.vpp < n:
        k1, k2, a, b = k2, k2 + 1, b, at(k2 + 1)
    return extrapolate(a, b, k1 * layout.vpp, k2 * layout.vpp, n)


def _peak_moved(a: dict, b: dict) -> bool:
    """Whether the peak fell at another kind of moment (``peak_moments``) or a memory category
    shrank with one more block per chunk: the peak fell at another moment of the step in the two
    traces, so they are not on one affine line (one more block is tried)."""
    return a.get("peak_moments") != b.get("peak_moments") or any(
        b.get(f, {}).get(k, 0) < v for f in MEMORY_FIELDS for k, v in a.get(f, {}).items()
    )


def trace_rank(target: RankTrace) -> dict:
    """One trace (meshwise.measure.verify_worker.trace_rank) in a fresh process: nothing of one trace's
    process group, meshes or DTensor's sharding cache (keyed by mesh shape, so it would hand a later
    trace a mesh of an ended group) reaches the next. The process is forked from a server that has
    loaded the fake CUDA device and imported torch and meshwise once (``forkserver``, preloading
    ``_trace_preload``), so a trace does not pay for the imports. A GPU profile is traced on fake
    ``cuda`` tensors; where the fake device cannot be built (no C++ compiler), on the cpu device with
    the GPU's precision policy, and the record says why (``device_note``)."""
    from meshwise.measure import verify_worker  # torch: imported once plan's or verify's flags are checked

    device, note = fake_device(target.precision_of)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["meshwise.measure._trace_preload"])  # by name: never loaded here
    with context.Pool(1) as pool:
        record = pool.apply(verify_worker.trace_rank, (target, device))
    if note:
        record.setdefault("device_note", note)
    return record


def fake_device(kind: str) -> tuple[str, str | None]:
    """(the device type the trace's tensors are on, why it is not the target's, or None): cuda for
    a GPU profile once the fake CUDA device is built (measure/fake_cuda.py; a few seconds, once per
    machine), else cpu."""
    if kind != "cuda":
        return "cpu", None
    try:
        fake_cuda.build()
    except MeshwiseError as e:
        return "cpu", f"{e}; traced on the cpu device with the GPU's precision policy"
    return "cuda", None


def verify_rows(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, record: dict) -> list[Row]:
    """compare.rows_for's rows with ``memory.states`` (params + grads + optimizer) before the total."""
    rows = rows_for(record, model, cluster, train)
    pred = {r.figure: r.predicted for r in rows}
    meas = measured_memory(record)
    states = ("params", "grads", "optimizer")
    rows.insert(
        len(MEMORY),
        Row("memory.states", record["rank"], sum(pred[f"memory.{c}"] for c in states), sum(meas[c] for c in states)),
    )
    return rows


def verify(
    model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, layout: Layout, ranks: list[int], depth: str = "auto"
) -> tuple[list[Row], list[dict]]:
    """Trace ``ranks`` of ``layout``; (rows beside the plan, the traced records with ``trace_s``)."""
    rows: list[Row] = []
    records = []
    for rank in ranks:
        start = time.perf_counter()
        target = RankTrace(
            model, layout, rank, train.global_batch, train.seq_len, device_type(cluster), float8_precision(train)
        )
        record = trace_record(target, depth)
        record["trace_s"] = time.perf_counter() - start
        records.append(record)
        rows += verify_rows(model, cluster, train, record)
    return rows, records


def verify_main(
    model_name: str,
    gpu: str,
    gpus: int,
    gpus_per_node: int | None,
    seq_len: int | None,
    global_batch: int,
    layout_text: str,
    ranks_text: str,
    depth: str,
    as_json: bool,
    precision: str = "auto",
) -> int:
    """Check every flag, then trace the layout's ranks. Eleven arguments: verify's flags, one each as
    cli.py parses them, all checked here before any trace starts."""
    model = load_model(model_name)
    cluster = load_cluster(gpu, gpus, gpus_per_node)
    seq = seq_len if seq_len is not None else default_seq_len(model)  # --seq-len 0 is refused, not the default
    train = verify_train(cluster, global_batch, seq, precision)
    layout = parse(layout_text, cluster.world_size, explicit=True)
    check_runnable(layout, model, cluster.world_size, global_batch, seq, seq_field="--seq-len")
    check_model_runs(model, seq)
    if depth not in DEPTHS:
        raise MeshwiseError(f"--depth: {depth!r} must be one of {', '.join(DEPTHS)}")
    ranks = parse_ranks(ranks_text, layout)
    kind = device_type(cluster)
    rows, records = verify(model, cluster, train, layout, ranks, depth)
    if as_json:
        print(
            json.dumps(
                {
                    "layout": layout.format(),
                    "model": model_name,
                    "rows": [r.as_json() for r in rows],
                    "traced": [
                        {
                            k: r[k]
                            for k in (
                                "rank",
                                "pp_rank",
                                "blocks",
                                "trace_s",
                                "device",
                                "activation_dtypes",
                                "activation_devices",
                                "float8_inputs",
                                "device_note",
                            )
                            if k in r
                        }
                        for r in records
                    ],
                }
            )
        )
        return 0
    print_rows(
        rows,
        f"{model.describe()}\nlayout {layout.short()}, rank(s) {ranks} of {cluster.world_size} traced on "
        f"fake {kind} devices ({train.precision}, --depth {depth}), global batch {global_batch} x {seq}, "
        f"predicted with --gpu {gpu}",
    )
    for r in records:
        print(
            f"rank {r['rank']} (pipeline rank {r['pp_rank']}, {r['blocks']} blocks): traced in {r['trace_s']:.1f} s; "
            f"matmuls computed in {', '.join(r['activation_dtypes'])} on {', '.join(r['activation_devices'])}"
            + (f" from float8 inputs ({', '.join(r['float8_inputs'])})" if r.get("float8_inputs") else "")
        )
    for note in sorted({r["device_note"] for r in records if "device_note" in r}):
        print(f"note: {note}")
    return 0


def verify_plan(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, plan, k: int, headroom: float):
    """``plan --verify K``: trace the top ``k`` candidates (``--ranks auto``, reduced depth) and keep
    those whose traced peak fits the device less the headroom, in the plan's order; a candidate the
    model said fits but the trace says does not is dropped with a warning naming the category that
    outgrew its prediction most. Returns the plan with those candidates, lines and warnings."""
    kind = device_type(cluster)
    if train.precision != runtime_precision(kind) and not float8_precision(train):
        raise MeshwiseError(
            f"--verify: the runtime trains in {runtime_precision(kind)} on {kind}; "
            f"use --precision {runtime_precision(kind)}"
        )
    if train.runtime != "meshwise":
        raise MeshwiseError("--verify: only meshwise's own runtime can be traced; use --runtime meshwise")
    check_model_runs(model, train.seq_len)
    limit = cluster.accelerator.memory_bytes * (1 - headroom)
    kept, lines, warnings = [], [], []
    for e in plan.candidates[:k]:
        start = time.perf_counter()
        rows, _ = verify(model, cluster, train, e.layout, auto_ranks(e.layout))
        totals = {r.rank: r for r in rows if r.figure == "memory.total"}
        worst = max(totals.values(), key=lambda r: r.measured)
        line = (
            f"Verified {e.layout.short()}: traced peak {worst.measured / 1e9:,.1f} GB on rank {worst.rank} "
            f"(predicted {worst.predicted / 1e9:,.1f} GB, {worst.rel_error:+.1%}) in "
            f"{time.perf_counter() - start:.0f} s"
        )
        if worst.measured <= limit:
            kept.append(e)
            lines.append(line + ": fits")
            continue
        over = max(
            (
                r
                for r in rows
                if r.rank == worst.rank
                and r.figure.startswith("memory.")
                and r.figure not in ("memory.total", "memory.states")
            ),
            key=lambda r: r.measured - r.predicted,
        )
        warnings.append(
            f"{e.layout.short()} dropped: the plan said it fits, the trace needs "
            f"{worst.measured / 1e9:,.1f} GB of {limit / 1e9:,.1f} GB on rank {worst.rank}; "
            f"{over.figure.removeprefix('memory.')} overflowed ({over.measured / 1e9:,.1f} GB traced, "
            f"{over.predicted / 1e9:,.1f} GB predicted)"
        )
        lines.append(line + ": does NOT fit")
    candidates = tuple(kept) + tuple(plan.candidates[k:])
    return dataclasses.replace(
        plan, candidates=candidates, explanation=(*plan.explanation, *lines), warnings=(*plan.warnings, *warnings)
    )
