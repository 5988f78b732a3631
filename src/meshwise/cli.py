"""The ``meshwise`` command: parses arguments and calls the modules below it; no logic of its own.

Bad input prints one line ``meshwise: error: ...`` and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys

from meshwise import __version__
from meshwise.errors import MeshwiseError, run_command
from meshwise.plan.command import DEFAULT_GLOBAL_BATCH, DEFAULT_GPU, DEFAULT_GPUS, DEFAULT_MODEL, DEFAULT_TOP
from meshwise.spec.train import DEFAULT_SEQ_CAP, DEFAULT_SEQ_STATES_ONLY, MOE_BALANCING

MODEL_WHAT = "a catalog name (e.g. llama3-8b), a model .toml or a Hugging Face config.json"
LAYOUT_WHAT = "key=value pairs, e.g. dp=8,zero=3,tp=2"
REPORT_WHAT = "an .html file name"
GPU_WHAT = "a catalog name (e.g. h100) or a profile .toml"
RUNTIME_CHOICES = ("meshwise", "megatron")
EMIT_CHOICES = ("torchtitan", "megatron", "deepspeed")


# the parsed flags each runtime command's main takes, in its parameters' order
VERIFY_FLAGS = tuple("model gpu gpus gpus_per_node seq_len global_batch layout ranks depth json precision".split())
MEASURE_FLAGS = tuple("layout nproc_per_node model steps global_batch seq_len gpu json report precision".split())


def _run_main(main, args: argparse.Namespace, names: tuple[str, ...]) -> int:
    """Warn where torch is not the release tested, then call a runtime command's ``main`` with the
    parsed flags ``names``, in that order (it takes them positionally)."""
    _warn_untested_torch()
    return main(*(getattr(args, name) for name in names))


def _warn_untested_torch() -> None:
    """launch/torch_release.py's one-line warning, imported here only by the commands that run torch:
    ``plan`` never imports the launch package (about 35 ms of a 0.9 s 405B search)."""
    from meshwise.launch.torch_release import warn_untested_torch  # start-up (see above)

    warn_untested_torch()


def _require_runtime(command: str, module: str = "torch") -> None:
    """The commands that run the runtime refuse in one line where its ``module`` is not installed
    (``pip install meshwise`` plans without torch; ``meshwise[train]`` adds torch, numpy, tokenizers and
    safetensors), before any work starts."""
    if importlib.util.find_spec(module) is None:
        raise MeshwiseError(
            f"{command}: needs {module}, which is not installed here; "
            "install the runtime with: pip install 'meshwise[train]'"
        )


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"meshwise: error: {field_first(message)}", file=sys.stderr)
        sys.exit(2)


def field_first(message: str) -> str:
    """argparse's ``argument --gpus: invalid int value: 'abc'`` as the house form ``--gpus: invalid int
    value 'abc'`` (the field first, as every other refusal names it)."""
    match = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message, re.S)
    if not match:
        return message
    rest = re.sub(r"^(invalid \S+ value): ", r"\1 ", match[2])
    return f"{match[1]}: {rest}"


def _given(what: str):
    """An argparse type refusing an empty value (``--model ''``), which would otherwise be read as
    'not given' and silently replaced by the default; ``what`` says what would be valid."""

    def text(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"an empty value; give {what}")
        return value

    text.__name__ = "text"
    return text


def _positive_float(text: str) -> float:
    """A finite number above zero (nan, inf, 0 and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="meshwise", description="Plan, run and measure the parallel layout of transformer training.")
    parser.add_argument("--version", action="version", version=f"meshwise {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    p = sub.add_parser(
        "plan",
        help="search every layout, pick the best that fits, explain why",
        description="Estimate memory and step time of every layout (DP, ZeRO-1/2/3, HSDP, TP+SP, PP "
        "schedules, activation checkpointing) and rank those that fit.",
        epilog="Exit status: 0 a plan, 2 bad input (one line), 3 nothing fits on these devices (the "
        "explanation and the JSON's why_nothing_fits say why and what would fit).",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--model", type=_given(MODEL_WHAT), help=f"catalog name, TOML file or HF config.json (default: {DEFAULT_MODEL})"
    )
    which.add_argument("--params", type=_positive_float, help="a bare parameter count, e.g. 70e9 (model states only)")
    _add_cluster_arguments(p, "number of devices", f"; {DEFAULT_SEQ_STATES_ONLY} with --params")
    p.add_argument(
        "--precision",
        default="bf16-mixed",
        help="bf16 (12 B/param), bf16-mixed (16), fp32 (16); float8 GEMMs over bf16-mixed: "
        "fp8 (per-tensor), fp8-rowwise, fp8-blockwise (12: bf16 moments), mxfp8 (Blackwell, MI355X); default bf16-mixed",
    )
    p.add_argument("--optimizer", default="adamw", help="adamw or sgd (default: adamw)")
    _add_runtime_arguments(p)
    p.add_argument(
        "--layout",
        action="append",
        type=_given(LAYOUT_WHAT),
        help="evaluate this layout (e.g. dp=8,zero=3,tp=2), even if it does not fit; repeat the flag, or "
        "separate layouts with ';', to compare several in one table, best first",
    )
    p.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"how many layouts to show (default: {DEFAULT_TOP})")
    p.add_argument("--headroom", type=float, default=None, help="fraction of device memory kept free (default: 0.10)")
    p.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="trace the top K candidates on fake devices (as 'meshwise verify'); drop any that do not fit",
    )
    _add_output_arguments(p, "print one JSON object instead of tables")
    _add_emit_arguments(p)
    _add_train_commands(sub)
    _add_calibrate_command(sub)
    _add_measure_command(sub)
    _add_verify_command(sub)
    return parser


def _add_output_arguments(p: argparse.ArgumentParser, json_help: str) -> None:
    """plan's and measure's --json (``json_help``: what it prints) and --report."""
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--report",
        metavar="HTML",
        type=_given(REPORT_WHAT),
        help="also write a self-contained HTML report with pictures (needs meshwise[report])",
    )


# plan's switches of Megatron-LM's communication overlap, each off by default: what it turns on
MEGATRON_OVERLAPS = {
    "--tp-comm-overlap": "the run turns on Transformer Engine's TP communication overlap (Megatron-LM's "
    "--tp-comm-overlap, off by default; NeMo's recipes turn it on): TP collectives hidden behind GEMMs, "
    "its userbuffers counted in memory; needs sp=on",
    "--moe-comm-overlap": "Megatron's --overlap-moe-expert-parallel-comm (off by default; DeepSeek-V3's "
    "DualPipe alike): the all-to-alls hidden behind another micro-batch's compute",
}


def _add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """plan's runtime whose kernels and overlap it predicts, and the mixture of experts' routing."""
    p.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default=None,
        help="whose kernels and overlap to predict: meshwise (this project's torch runtime) or megatron "
        "(Megatron-LM/NeMo: distributed optimizer, fused kernels, Megatron-Core's memory); default: the "
        "profile's runtime key, else meshwise",
    )
    p.add_argument(
        "--moe-capacity-factor",
        type=float,
        default=0.0,
        metavar="C",
        help="mixture of experts: Megatron's --moe-expert-capacity-factor with inputs padded to it (every "
        "expert runs C x its mean load); default 0: dropless, the busiest rank at the measured "
        "imbalance of --moe-balancing",
    )
    p.add_argument(
        "--moe-balancing",
        choices=MOE_BALANCING,
        default="aux-loss",
        help="how dropless routing is balanced (catalog/moe_imbalance.toml): aux-loss (default), "
        "aux-loss-free (per-expert bias, DeepSeek-V3), forced (even by construction: a benchmark's fake gate) or "
        "random (uniform top-k: Megatron's --moe-router-force-load-balancing)",
    )
    p.add_argument(
        "--mtp-layers",
        type=int,
        default=0,
        metavar="N",
        help="with --runtime megatron: multi-token-prediction modules trained beside the model (Megatron's "
        "--mtp-num-layers; DeepSeek-V3 trains 1), priced on the last pipeline stage; default 0",
    )
    for flag, what in MEGATRON_OVERLAPS.items():
        p.add_argument(flag, action="store_true", help=f"with --runtime megatron: {what}")


def _add_emit_arguments(p: argparse.ArgumentParser) -> None:
    """plan's --emit and its time-and-cost figures (plan/emit.py, plan/budget.py)."""
    p.add_argument(
        "--emit",
        choices=EMIT_CHOICES,
        help="print the chosen layout (or each --layout) as that framework's configuration on stdout: "
        "torchtitan command-line overrides, Megatron-LM arguments, or a DeepSpeed JSON",
    )
    p.add_argument(
        "--tokens",
        type=_positive_float,
        metavar="N",
        help="token budget (e.g. 15e12): add wall-clock days and GPU-hours to each layout",
    )
    p.add_argument(
        "--price-per-gpu-hour",
        type=_positive_float,
        metavar="P",
        help="price of one GPU-hour (needs --tokens): add the cost of the budget to each layout",
    )
    _add_failure_arguments(p)


def _add_failure_arguments(p: argparse.ArgumentParser) -> None:
    """plan's failure model (cost/failures.py; defaults and sources: catalog/failures.toml). Checked by
    plan/failures.py, so a bad value is one line naming the field."""
    p.add_argument(
        "--failure-rate",
        type=float,
        metavar="R",
        help="interruptions per GPU-hour (default: the catalog's, per GPU, node and NIC)",
    )
    p.add_argument("--mtbf-hours", type=float, metavar="H", help="the whole job's mean time between failures")
    p.add_argument(
        "--storage-gbps",
        type=float,
        metavar="G",
        help="checkpoint storage bandwidth per node in Gb/s (default: 7.8, Llama 3's 2 TB/s over 2,048 nodes)",
    )
    p.add_argument(
        "--restart-minutes",
        type=float,
        metavar="MIN",
        help="minutes from a failure to training again, before reading the checkpoint (default: 11)",
    )


def _add_cluster_arguments(p: argparse.ArgumentParser, gpus_help: str, seq_note: str = "") -> None:
    """The options plan and verify share: the accelerator, the devices, the sequence and the batch."""
    p.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        type=_given(GPU_WHAT),
        help=f"accelerator: catalog name or profile .toml (default: {DEFAULT_GPU})",
    )
    p.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help=f"{gpus_help} (default: {DEFAULT_GPUS})")
    p.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (default: the accelerator's, 8)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"tokens per sequence (default: the model's max sequence, capped at {DEFAULT_SEQ_CAP}{seq_note})",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=DEFAULT_GLOBAL_BATCH,
        help=f"sequences per optimizer step (default: {DEFAULT_GLOBAL_BATCH})",
    )


# the commands that run the runtime on this machine: (help, description)
RUNTIME_COMMANDS = {
    "verify": (
        "trace ranks of a layout at full scale on fake devices, beside the plan",
        "Build the chosen ranks of the layout with the real runtime at the real world size (torch's fake "
        "process group, fake tensors, the target device's precision policy), trace one training step, "
        "and print memory by category and every collective beside what 'plan' predicts, as 'measure' "
        "does.",
    ),
    "measure": (
        "run a layout for a few steps: predicted beside measured",
        "Run the layout through the real runtime on local processes (gloo on CPU) and "
        "print, per rank and figure, what 'plan' predicts, what was measured and the "
        "relative error: memory by category, collectives per kind and mesh dimension, "
        "step time.",
    ),
    "calibrate": (
        "microbenchmark this machine into an accelerator profile (.toml)",
        "Measure matmul FLOP/s at the model's shapes, achieved efficiency, memory bandwidth "
        "and gloo collective bandwidth/latency on N local processes; write a profile that "
        "'plan --gpu FILE' reads.",
    ),
}


def _add_runtime_command(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    """The parser of the runtime command ``name``, with its help and description (:data:`RUNTIME_COMMANDS`)."""
    help_text, description = RUNTIME_COMMANDS[name]
    return sub.add_parser(name, help=help_text, description=description)


def _add_verify_command(sub: argparse._SubParsersAction) -> None:
    v = _add_runtime_command(sub, "verify")
    v.add_argument(
        "--layout", required=True, type=_given(LAYOUT_WHAT), help="the layout to trace (e.g. dp=8,zero=3,tp=8)"
    )
    v.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        type=_given(MODEL_WHAT),
        help=f"catalog name or model file (default: {DEFAULT_MODEL})",
    )
    _add_cluster_arguments(v, "world size traced")
    v.add_argument("--ranks", default="auto", help="auto (first, middle and last pipeline stage) or a list, e.g. 0,63")
    v.add_argument("--depth", default="auto", help="auto (trace 3 and 4 blocks per chunk, scale per block) or full")
    v.add_argument("--json", action="store_true", help='print {"rows": [...]} (measure\'s schema) instead of a table')
    _add_runtime_precision_argument(v, "")


def _verify(args: argparse.Namespace) -> int:
    _require_runtime("verify")
    from meshwise.measure.verify import verify_main  # torch: imported by the commands that run it

    return _run_main(verify_main, args, VERIFY_FLAGS)


def _add_measure_command(sub: argparse._SubParsersAction) -> None:
    m = _add_runtime_command(sub, "measure")
    m.add_argument(
        "--layout", type=_given(LAYOUT_WHAT), help="the layout (e.g. dp=2,zero=3); dp defaults to the process count"
    )
    m.add_argument("--nproc-per-node", type=int, default=2, help="local processes (default: 2)")
    m.add_argument(
        "--model", default="tiny", type=_given(MODEL_WHAT), help="catalog name or model file (default: tiny)"
    )
    m.add_argument(
        "--steps",
        type=int,
        default=3,
        help="timed steps after the measured one; 0 = memory and collectives only (default: 3)",
    )
    m.add_argument("--global-batch", type=int, default=8, help="sequences per step (default: 8)")
    m.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's max_seq)")
    m.add_argument(
        "--gpu",
        default=None,
        type=_given(GPU_WHAT),
        help="profile the prediction uses: catalog name or calibrated .toml "
        "(default: this machine's calibration, measured at first use and cached; cpu = the catalog's)",
    )
    _add_own_runtime_argument(m, "measured")
    _add_runtime_precision_argument(m, ", CUDA")
    _add_output_arguments(m, 'print {"rows": [...]} instead of a table')


def _add_runtime_precision_argument(p: argparse.ArgumentParser, float8_where: str) -> None:
    """measure's and verify's --precision: the runtime's own, or a float8 recipe (``float8_where``:
    where it runs, e.g. ``", CUDA"``)."""
    p.add_argument(
        "--precision",
        default="auto",
        help="auto (the runtime's: bf16-mixed on GPU, fp32 on CPU), fp8 or fp8-rowwise "
        f"(torchao float8 linears{float8_where})",
    )


def _add_own_runtime_argument(p: argparse.ArgumentParser, verb: str) -> None:
    """measure's and calibrate's --runtime: every choice plan knows, refused by :func:`_only_meshwise`
    but for meshwise."""
    p.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default="meshwise",
        help=f"the runtime {verb}; only meshwise (this project's own) can run here",
    )


def _only_meshwise(runtime: str, command: str) -> None:
    """measure and calibrate run this project's runtime; Megatron-LM is not installed to be timed."""
    if runtime != "meshwise":
        raise MeshwiseError(
            f"--runtime: {command} can only run meshwise's own runtime here, not {runtime!r}; "
            f"use 'meshwise plan --runtime {runtime}' for its prediction"
        )


def _measure(args: argparse.Namespace) -> int:
    _only_meshwise(args.runtime, "measure")
    _require_runtime("measure")
    from meshwise.measure.command import measure_main  # torch: imported by the commands that run it

    return _run_main(measure_main, args, MEASURE_FLAGS)


def _add_calibrate_command(sub: argparse._SubParsersAction) -> None:
    c = _add_runtime_command(sub, "calibrate")
    c.add_argument("--nproc-per-node", type=int, default=2, help="local processes, one thread each (default: 2)")
    c.add_argument(
        "--model", default=None, help="model whose shapes are timed (default: small on CPU, llama3-8b on CUDA)"
    )
    c.add_argument("--seq-len", type=int, default=None, help="tokens per timed sequence (default: the model's max_seq)")
    _add_own_runtime_argument(c, "calibrated")
    c.add_argument("--out", default="meshwise-profile.toml", help="profile to write (default: meshwise-profile.toml)")
    c.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPU op model's components on CUDA when torch sees a device, else this CPU's "
        "profile (docs/runtime.md)",
    )
    c.add_argument(
        "--toy",
        action="store_true",
        help="the CUDA calibration's steps at toy sizes, on the CPU "
        "without a device (checks its plumbing; figures describe nothing)",
    )


def _calibrate(args: argparse.Namespace) -> int:
    _only_meshwise(args.runtime, "calibrate")
    _require_runtime("calibrate")
    # torch: imported by the commands that run it
    from meshwise.measure.calibrate_gpu import gpu_path, run_gpu_calibration

    if gpu_path(args.device, args.toy):
        return run_gpu_calibration(args.model or "llama3-8b", args.out, args.seq_len, args.toy)
    from meshwise.measure.calibrate import calibrate  # torch: imported by the commands that run it

    table = calibrate(args.nproc_per_node, args.model or "small", args.out, args.seq_len)
    print(
        f"{args.out}: matmul {table['peak_fp32_flops_per_s'] / 1e9:.1f} GFLOP/s, efficiency "
        f"{table['efficiency_max']:.2f}, memory {table['hbm_bytes_per_s'] / 1e9:.1f} GB/s, link "
        f"{table['intra_bytes_per_s'] / 1e9:.2f} GB/s + {table['intra_latency_s'] * 1e6:.0f} us, "
        f"{table['memory_bytes'] / 1e9:.1f} GB per rank"
    )
    print(
        f"  per operator {table['op_overhead_s'] * 1e6:.1f} us (DTensor +{table['tp_op_s'] * 1e6:.0f} us); FSDP2 "
        f"{table['fsdp_call_s'] * 1e6:.0f} us per call + {table['fsdp_param_s'] * 1e6:.1f} us per tensor + "
        f"{table.get('fsdp_byte_s', 0) * 1e9:.2f} ms per MB; GEMMs "
        f"{table.get('cpu_gemm_flops_per_s', 0) / 1e9:.1f} GFLOP/s + {table.get('cpu_gemm_call_s', 0) * 1e6:.1f} us"
    )
    for clause in table["source"].split("; "):  # each fitted component's own error on its own data
        if "error" in clause:
            print(f"  {clause}")
    return 0


def _add_train_commands(sub: argparse._SubParsersAction) -> None:
    """train / export / generate; their work (and torch) is imported only when they run."""
    _add_passthrough_command(sub, "train", "train a model under a layout (auto: the planner's)")
    _add_passthrough_command(sub, "tune", "measure the planner's closest layouts; pick the fastest, refit the profile")
    e = sub.add_parser("export", help="write a checkpoint as a Hugging Face folder (safetensors, config.json)")
    e.add_argument("--checkpoint", required=True, help="a checkpoint folder (DIR/step-N), or DIR for its latest")
    e.add_argument("--out", default="model.safetensors", help="output file (default: model.safetensors)")
    k = sub.add_parser("tokenize", help="pre-tokenize text / JSONL / Parquet into a .bin token array")
    k.add_argument("--data", required=True, help="a text, .jsonl or .parquet file, or a folder of them")
    k.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json, or its folder")
    k.add_argument(
        "--out", required=True, help="the .bin file to write (uint16, or uint32 for vocabularies over 65,536)"
    )
    k.add_argument("--text-field", default="text", help="the text field of JSONL / Parquet rows (default: text)")
    g = sub.add_parser("generate", help="sample text from a checkpoint")
    g.add_argument("--checkpoint", required=True, help="a checkpoint folder (DIR/step-N), or DIR for its latest")
    g.add_argument("--prompt", default="", help="text to continue")
    g.add_argument("--tokens", type=int, default=200, help="tokens to generate (default: 200; fewer at eos)")
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: 0.8)")
    g.add_argument("--top-k", type=int, default=20, help="sample among the k most likely (default: 20; 0 = all)")
    g.add_argument("--seed", type=int, default=0)


def _add_passthrough_command(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    """A command that parses its own arguments: with no option prefix, every argument after ``name``
    goes, untouched, to ``args.<name>_args`` (train.command and tune.command parse them)."""
    p = sub.add_parser(
        name,
        add_help=False,
        prefix_chars="\x01",
        help=help_text,
        description=f"meshwise {name} --help lists every option",
    )
    p.add_argument(f"{name}_args", nargs=argparse.REMAINDER)


def _train(args: argparse.Namespace) -> int:
    _require_runtime("train")
    from meshwise.train.command import train_main  # torch: imported by the commands that run it

    _warn_untested_torch()

    return train_main(args.train_args)


def _tune(args: argparse.Namespace) -> int:
    from meshwise.tune.command import tune_main  # torch: imported by the commands that run it

    _warn_untested_torch()
    return tune_main(args.tune_args)


def _export(args: argparse.Namespace) -> int:
    _require_runtime("export")
    from meshwise.train.command import export_main  # torch: imported by the commands that run it

    return export_main(args.checkpoint, args.out)


def _tokenize(args: argparse.Namespace) -> int:
    _require_runtime("tokenize", "tokenizers")
    from meshwise.train.tokenizer import tokenize_main  # torch: imported by the commands that run it

    return tokenize_main(args.data, args.tokenizer, args.out, args.text_field)


def _generate(args: argparse.Namespace) -> int:
    _require_runtime("generate")
    from meshwise.train.command import generate_main  # torch: imported by the commands that run it

    return generate_main(args.checkpoint, args.prompt, args.tokens, args.temperature, args.top_k, args.seed)


def _plan(args: argparse.Namespace) -> int:
    if args.verify:
        _require_runtime("--verify")
    from meshwise.plan.command import Extras, Request, Shown, plan_main  # start-up: the other commands skip it
    from meshwise.plan.failures import FailureOptions  # start-up: as plan.command

    moe = {
        "moe_capacity_factor": args.moe_capacity_factor,
        "moe_balancing": args.moe_balancing,
        "overlap_ep_comm": args.moe_comm_overlap,
        "mtp_layers": args.mtp_layers,
    }
    request = Request(
        args.model,
        args.params,
        args.gpu,
        args.gpus,
        args.gpus_per_node,
        args.seq_len,
        args.global_batch,
        args.precision,
        args.optimizer,
        args.runtime,
        args.tp_comm_overlap,
        moe,
    )
    shown = Shown(args.layout, args.top, args.headroom, args.json, args.report, args.verify)
    extras = Extras(
        emit=args.emit,
        tokens=args.tokens,
        price_per_gpu_hour=args.price_per_gpu_hour,
        failures=FailureOptions(args.failure_rate, args.mtbf_hours, args.storage_gbps, args.restart_minutes),
    )
    return plan_main(request, shown, extras)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    command = {
        "plan": _plan,
        "train": _train,
        "export": _export,
        "generate": _generate,
        "tokenize": _tokenize,
        "tune": _tune,
        "calibrate": _calibrate,
        "measure": _measure,
        "verify": _verify,
    }[args.command]
    return run_command(lambda: command(args))


if __name__ == "__main__":
    sys.exit(main())
