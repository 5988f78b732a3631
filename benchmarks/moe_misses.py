"""Every MoE run of the published sets whose predicted step misses by more than a threshold, with what
it shares with the others: its origin, runtime (Megatron-Core, torchtitan, or meshwise's own), GPU, where
its EP group runs (inside one NVLink domain or across several), experts and top-k, dispatcher, expert kernel
and balancing, and the plan's split part by part, per MoE layer and micro-batch on the slowest stage.

Per layer call: a step's seconds over ``m * L_moe / pp`` (the MoE layers of one stage times its micro-batches;
the uneven stages some runs state are averaged out). ``rest`` is the stage's compute outside the MoE parts
(attention, norms, the dense layers, the head), ``a2a`` the dispatch and combine all-to-alls, ``other`` the
rest of the exposed communication (TP, PP, DP), ``miss`` the published step less the predicted one. Nothing
here is fitted; it reads estimate()'s split (cost/estimate.py ``StepTime``).

    python benchmarks/moe_misses.py [--above 0.20] [--set test5 ...]
"""

from __future__ import annotations

import argparse
import sys

from band import SEEN
from fidelity import SETS, Run, load_runs
from meshwise.cost.estimate import estimate


def ep_span(run: Run) -> str:
    """Where the EP group's ranks sit: ``nvl`` inside one NVLink domain, else ``xN`` domains."""
    layout = run.layout
    if layout.ep <= 1:
        return "-"
    stride = 1 if layout.ep_folds_tp else layout.tp
    domains = -(-layout.ep * stride // run.cluster.domain_gpus)  # ceiling: a part-filled domain counts
    return "nvl" if domains <= 1 else f"x{domains}"


def runtime_of(run: Run) -> str:
    """The code the run ran where its entry names it (``framework``: torchtitan priced under meshwise's
    runtime), else the runtime it is priced under (megatron, meshwise)."""
    return run.framework or run.train.runtime


def row(run: Run) -> tuple[float, str]:
    """(error, the run's two lines): its traits, then its split per MoE layer call in ms."""
    time = estimate(run.model, run.cluster, run.train, run.layout).time
    error = time.step_s / run.published_step_s - 1
    model, train, layout = run.model, run.train, run.layout
    m = layout.accum(train.global_batch)
    calls = m * model.moe_layers / layout.pp
    parts = dict(time.moe_block_s)
    a2a_s = parts.pop("dispatch_combine_s", 0.0)
    moe_s = sum(parts.values())
    per_ms = 1e3 / calls
    traits = (
        f"{run.id} | {run.set} | {run.origin} | {runtime_of(run)} | {run.gpu} x {run.cluster.world_size} | "
        f"ep {layout.ep} {ep_span(run)}{' etp=1' if layout.ep_folds_tp else ''} | E {model.experts} k "
        f"{model.experts_per_token} f {model.expert_ffn_hidden} h {model.hidden} | {train.moe_dispatcher} | "
        f"{train.expert_gemm} | {train.moe_balancing}{f' cap {train.moe_capacity_factor}' if train.moe_capacity_factor else ''}"
        f" | {error:+.1%}"
    )
    split = (
        f"    `{layout}` m {m}, {calls:.0f} layer calls; per call ms: rest {(time.compute_s - moe_s) * per_ms:.2f}, "
        + ", ".join(f"{k[:-2]} {v * per_ms:.2f}" for k, v in parts.items() if v)
        + f", a2a {a2a_s * per_ms:.2f}, other {(time.comm_exposed_s - a2a_s) * per_ms:.2f}, "
        f"bubble {time.bubble_s * per_ms:.2f}; published {run.published_step_s * per_ms:.2f}, "
        f"miss {(run.published_step_s - time.step_s) * per_ms:+.2f}"
    )
    return error, traits + "\n" + split


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--above", type=float, default=0.20, help="|error| above which a run is listed")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        choices=SETS,
        help="a set (default: every seen one, band.py's SEEN: a set not yet evaluated is priced only if named)",
    )
    args = parser.parse_args(argv)
    for set_name in args.sets or SEEN:
        for run in load_runs(set_name=set_name):
            if run.moe:
                error, lines = row(run)
                if abs(error) > args.above:
                    print(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
