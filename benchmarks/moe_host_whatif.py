"""Fine-grained MoE under Megatron on GB200: what the Megatron-LM DeepSeek-V3 GB200 guide's optimization steps
recovered, per MoE layer call, and what host-issue terms counted from Megatron's kernels would move on top of the
model (what-ifs; the MoE block's own host floor is priced, cost/moe_block.py ``host_s``: docs/fidelity.md,
"Fine-grained MoE under Megatron on GB200").

- **The guide's steps** (NVIDIA/Megatron-LM docs/discussions/deepseek-v3-gb200-optimization at eb0783b, Sec. 3's
  table, TFLOP/s per GPU at one model and layout): each step's saving in ms per MoE layer call and micro-batch,
  ``FLOPs per GPU per step x (1 / F_before - 1 / F_after) / layer calls``, the FLOPs per step taken from the run
  entry (published step x 494.46 TFLOP/s) and the layer calls from its layout.
- **The host-issue what-if**, on every run priced under ``--runtime megatron``: host calls per MoE layer call
  (forward + backward) counted as the op model's kernels of the block (cost/moe_block.py ``ROUTER_KERNELS``,
  ``PERMUTE_KERNELS`` or cost/moe_dispatch.py ``DEEPEP_KERNELS``, 3 GEMMs per local expert and projection), at
  the host side of one torch Linear forward on the device's host CPU (TransformerEngine issue #2053: 37.08 us on
  GB200's Grace, 33.17 us on GH200's, 13.48 us on a DGX H100's Xeon 8480C, taken for every other host), either
  as a floor under the GPU's work per call (``max``) or serialised with it (``sum``); and the whole layer's
  kernels counted on megatron-core's local spec (``LAYER_KERNELS``) as a floor (``layer``).

    python benchmarks/moe_host_whatif.py            # both, every set
"""

from __future__ import annotations

from fidelity import SETS, load_runs
from meshwise.cost import moe_block, moe_dispatch
from meshwise.cost.estimate import estimate

# (feature, TFLOP/s per GPU after it): the guide's Sec. 3 table, in its order
GUIDE = (
    ("baseline (alltoall)", 494.46),
    ("fused scale allocation, permute kernel", 529.55),
    ("router fusion", 540.00),
    ("DeepEP", 566.07),
    ("up_proj recompute removed", 610.71),
    ("CUDA graphs", 663.27),
    ("DeepEP tuned", 691.49),
    ("CPU-side optimization (NUMA binding)", 762.12),
    ("PDL for quantization, fused swizzle", 797.67),
    ("CUDA graphs capture the shared expert", 829.93),
    ("HybridEP", 943.56),
    ("CPU-side optimization", 956.21),
    ("quantization fused into the norm", 970.01),
)
HOST_CALL_S = {"gb200": 37.08e-6, "gh200": 33.17e-6}  # TransformerEngine #2053, torch Linear forward, host side
XEON_CALL_S = 13.48e-6  # the same on a DGX H100 (Xeon Platinum 8480C)
# Kernels (aten ops that launch one) of a whole megatron-core 0.16.1 TransformerLayer call, forward + backward, by
# router kind, less the local experts', and per local expert: its local spec counted on this CPU (standard
# attention, RMSNorm, SequentialMLP; 8 and 16 experts top-2 softmax: 285 and 421; 16 experts top-8 with the grouped
# sigmoid router: 458; docs/fidelity.md)
LAYER_KERNELS = {"softmax": 149, "sigmoid-grouped": 186}
LAYER_KERNELS_PER_EXPERT = 17


def layer_calls(run) -> float:
    """MoE layer calls per step on a rank: micro-batches x the stage's MoE layers."""
    return run.layout.accum(run.train.global_batch) * run.model.moe_layers / run.layout.pp


def guide_steps() -> list[tuple[str, float, float]]:
    """The guide's steps: (feature, ms per MoE layer call after it, ms it saved) (module docstring)."""
    (run,) = load_runs("mcore-dsv3-gb200-guide-alltoall-256")
    flops_per_gpu = run.published_step_s * GUIDE[0][1]  # TFLOP per GPU per step
    per_ms = 1e3 / layer_calls(run)
    rows, before_s = [], run.published_step_s
    for name, tflops in GUIDE:
        step_s = flops_per_gpu / tflops
        rows.append((name, step_s * per_ms, (before_s - step_s) * per_ms))
        before_s = step_s
    return rows


def host_calls(run) -> float:
    """Kernels of one MoE layer call, forward + backward, as the op model counts them (module docstring)."""
    model, train, layout = run.model, run.train, run.layout
    n = sum(moe_block.ROUTER_KERNELS[moe_block.router_kind(model)])
    if train.moe_dispatcher == "deepep":
        n += sum(moe_dispatch.DEEPEP_KERNELS)
    else:
        n += sum(moe_block.PERMUTE_KERNELS["megatron"]) + (6 if layout.ep > 1 else 0)
    return n + (model.experts // layout.ep) * 2 * 3


def layer_kernels(run) -> float:
    """Kernels of one whole layer call, forward + backward, on megatron-core's local spec (``LAYER_KERNELS``)."""
    kind = moe_block.router_kind(run.model)
    return LAYER_KERNELS[kind] + LAYER_KERNELS_PER_EXPERT * (run.model.experts // run.layout.ep)


def what_if() -> None:
    """Every set's MoE mean / worst |error| as priced and under each what-if form."""
    for name in SETS:
        errors = {"priced": [], "max": [], "sum": [], "layer": []}
        for run in load_runs(set_name=name):
            if not run.moe:
                continue
            time = estimate(run.model, run.cluster, run.train, run.layout).time
            extra = {"max": 0.0, "sum": 0.0, "layer": 0.0}
            if run.train.runtime == "megatron":
                calls = layer_calls(run)
                gpu_s = (time.compute_s + dict(time.moe_block_s).get("dispatch_combine_s", 0.0)) / calls
                call_s = HOST_CALL_S.get(run.gpu, XEON_CALL_S)
                host_s, layer_s = host_calls(run) * call_s, layer_kernels(run) * call_s
                extra = {
                    "max": calls * max(0.0, host_s - gpu_s),
                    "sum": calls * host_s,
                    "layer": calls * max(0.0, layer_s - gpu_s),
                }
            errors["priced"].append(abs(time.step_s / run.published_step_s - 1))
            for form, add in extra.items():
                errors[form].append(abs((time.step_s + add) / run.published_step_s - 1))
        if errors["priced"]:
            cells = ", ".join(f"{f} {sum(e) / len(e):.1%} / {max(e):.1%}" for f, e in errors.items())
            print(f"{name}: {len(errors['priced'])} MoE runs: {cells}")


def main() -> None:
    (run,) = load_runs("mcore-dsv3-gb200-guide-alltoall-256")
    calls = layer_calls(run)
    print(f"{run.id}: {calls:.0f} MoE layer calls per step; ms per call after each step (saving)")
    for name, ms, saved in guide_steps():
        print(f"  {name:42s} {ms:6.2f} ms  ({saved:+.2f})")
    time = estimate(run.model, run.cluster, run.train, run.layout).time
    print(f"  meshwise's prediction of the baseline: {time.step_s * 1e3 / calls:.2f} ms per call")
    what_if()


if __name__ == "__main__":
    main()
