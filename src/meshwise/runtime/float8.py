"""Float8 training with torchao, the path torchtitan takes (``Float8LinearConverter``).

``fp8`` is torchao's ``tensorwise`` recipe (one dynamic scale per tensor: activations and weights in
e4m3, output gradients in e5m2); ``fp8-rowwise`` its ``rowwise`` recipe (one scale per row, e4m3
throughout, scales rounded to powers of two). ``fp8-blockwise`` and ``mxfp8`` are planned, not run:
:func:`refusal` names why.

What changes, in the order :mod:`meshwise.runtime.parallelize` composes:

- :func:`convert` swaps the transformer blocks' ``nn.Linear`` layers for torchao's ``Float8Linear``
  (``convert_to_float8_training``) on the meta model, before TP. It keeps in high precision what the
  recipes keep: the embedding, the LM head (``output``), the MoE router and shared-expert gate, the
  norms and the softmax (none of them a block ``nn.Linear``), and the grouped experts (torchao's
  float8 grouped GEMM is a prototype, not taken here). A linear is converted only if both GEMM
  dimensions each rank multiplies are multiples of 16 (``torch._scaled_mm`` on GPUs; torchao's own
  filter): under TP that is the sharded dimension divided by ``tp``. What is skipped is reported.
- TP (tensorwise): torchao's ``Float8ColwiseParallel`` / ``Float8RowwiseParallel``, and
  ``PrepareFloat8ModuleInput`` where every column-parallel linear of a region is float8, so the
  sequence-parallel all-gather moves float8 (:func:`tp_styles`). The rowwise recipe keeps the plain
  TP styles (torchtitan enables float8 TP for tensorwise only).
- FSDP2 (tensorwise, ``zero`` >= 1): weights are all-gathered in float8
  (``enable_fsdp_float8_all_gather``), with their scales computed for all weights in one
  all-reduce before each step and evaluation (``precompute_float8_dynamic_scale_for_fsdp``,
  :func:`after_optimizer_step`; torchtitan calls it after the optimizer step, which is the same
  moment except after a checkpoint restore or a weight load).

On a CPU rank the float8 GEMMs are torchao's emulation (``emulate``: the float8 values and scales
multiplied in fp32), the numbers torch's CPU ``_scaled_mm`` gives at about 1/100 of its time.

Master weights, gradients and optimizer states keep the precision the runtime keeps without fp8
(fp32 on CPU; fp32 master with bf16 compute under FSDP2 on GPU): float8 is the GEMM inputs only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from meshwise.errors import MeshwiseError
from meshwise.runtime import _torch_private

RECIPES = {"fp8": "tensorwise", "fp8-rowwise": "rowwise"}  # meshwise name -> torchao recipe name
PLANNED_ONLY = {
    "fp8-blockwise": (
        "torchao's 128x128 / 1x128 block-scaled training is a prototype "
        "(torchao.prototype.blockwise_fp8_training) that this runtime does not wire"
    ),
    "mxfp8": (
        "MX block scaling needs MX tensor cores (Blackwell, sm_100), and torchao's MX training "
        "(torchao.prototype.mx_formats) is not wired into this runtime"
    ),
}
ALIGN = 16  # GEMM dimensions torch._scaled_mm takes on GPUs (torchao's module filter)
HIGH_PRECISION = ("output", "router", "shared_gate")  # leaf names kept out of float8 (recipes keep them bf16)
_COLWISE = re.compile(r"^layers\.\d+\.(attention\.(wq|wk|wv)|mlp\.(w1|w3))$")  # TP-sharded on the output dim
_ROWWISE = re.compile(r"^layers\.\d+\.(attention\.wo|mlp\.w2)$")  # TP-sharded on the input dim


def is_float8(precision: str | None) -> bool:
    return precision in RECIPES


def refusal(precision: str, device_type: str) -> str | None:
    """Why this runtime cannot train ``precision`` on ``device_type`` (None: it can)."""
    if precision in PLANNED_ONLY:
        return (
            f"--precision {precision}: planned only, `train` cannot run it: {PLANNED_ONLY[precision]}; "
            f"runnable: {', '.join(RECIPES)}"
        )
    if precision not in RECIPES:
        return None
    try:
        _torchao()
    except ImportError:
        return f"--precision {precision}: needs torchao (pip install 'meshwise[fp8]')"
    if device_type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
        name = torch.cuda.get_device_name()
        return f"--precision {precision}: {name} has no float8 tensor cores (needs sm_89 or newer: L4, H100, B200)"
    return None


def check(precision: str | None, device_type: str) -> None:
    if precision and (reason := refusal(precision, device_type)):
        raise MeshwiseError(reason)


def resolve(precision: str, device_type: str, field: str = "--precision") -> str | None:
    """What ``parallelize`` takes for a requested ``precision``: None for the device's own (``auto``,
    or its name: fp32 on CPU, bf16-mixed on CUDA), else a float8 format this device runs; anything
    else is refused in one line, never run in another precision."""
    own = "bf16-mixed" if device_type == "cuda" else "fp32"
    if precision in ("auto", own):
        return None
    if precision in RECIPES or precision in PLANNED_ONLY:
        check(precision, device_type)
        return precision
    raise MeshwiseError(
        f"{field} {precision}: the runtime trains in {own} on {device_type} (its own precision); "
        f"valid here: auto, {own}, {', '.join(RECIPES)}"
    )


@contextmanager
def _quiet_import() -> Iterator[None]:
    """torchao's import logs a warning per CUDA-only library that fails to load (its CUTLASS kernels on
    a CPU build) and torch's pytree warns about an enum torchao registers; neither matters to float8
    training through ``torch._scaled_mm``, so both loggers are raised to ERROR during the import."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _torchao():
    with _quiet_import():
        import torchao.float8 as float8  # optional: torchao is the fp8 extra
    return float8


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert` did: linear names converted and (name, reason) skipped."""

    precision: str
    converted: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]

    def line(self) -> str:
        recipe = RECIPES[self.precision]
        total = len(self.converted) + len(self.skipped)
        text = (
            f"Precision: {self.precision} (torchao {recipe} float8 GEMMs) in {len(self.converted)} of {total} linears"
        )
        if self.skipped:
            shown = ", ".join(f"{name} ({why})" for name, why in self.skipped[:4])
            more = f" and {len(self.skipped) - 4} more" if len(self.skipped) > 4 else ""
            text += f"; not in float8: {shown}{more}"
        return text + "; the embedding, norms and router compute in the run's own precision"


def skip_reason(name: str, module: nn.Linear, tp: int) -> str | None:
    """Why the linear ``name`` stays in high precision under ``tp`` (None: it is converted)."""
    if name.rsplit(".", 1)[-1] in HIGH_PRECISION or not name.startswith("layers."):
        return "the head" if name == "output" else "kept by the recipe"
    out_dim, in_dim = module.out_features, module.in_features
    if _COLWISE.match(name):
        out_dim //= tp if out_dim % tp == 0 else 1
    elif _ROWWISE.match(name):
        in_dim //= tp if in_dim % tp == 0 else 1
    if out_dim % ALIGN or in_dim % ALIGN:
        where = f" per TP rank (tp={tp})" if tp > 1 and (_COLWISE.match(name) or _ROWWISE.match(name)) else ""
        return f"{in_dim}x{out_dim}{where}, not multiples of {ALIGN}"
    return None


def linear_config(precision: str, fsdp_float8_all_gather: bool = False, emulate: bool = False):
    """torchao's ``Float8LinearConfig`` for ``precision``; ``emulate``: torchao's emulated GEMMs (the
    float8 values and scales multiplied in fp32), which a CPU rank runs (:func:`convert`)."""
    float8 = _torchao()
    config = float8.Float8LinearConfig.from_recipe_name(RECIPES[precision])
    return replace(
        config,
        enable_fsdp_float8_all_gather=fsdp_float8_all_gather or config.enable_fsdp_float8_all_gather,
        emulate=emulate,
    )


def fsdp_float8_all_gather(precision: str | None, zero: int, dp_shard_ranks: int) -> bool:
    """Whether FSDP2 all-gathers the float8 weights: tensorwise scaling, ZeRO >= 1 over > 1 rank."""
    return precision == "fp8" and zero >= 1 and dp_shard_ranks > 1


def convert(
    model: nn.Module, precision: str, tp: int = 1, fsdp_float8_all_gather: bool = False, emulate: bool = False
) -> Conversion:
    """Swap ``model``'s eligible block linears for ``Float8Linear`` in place (module docstring).
    ``emulate`` on a CPU rank: torchao's emulated GEMMs give the numbers torch's CPU ``_scaled_mm``
    gives (``tests/unit/test_float8.py``) in about 1/100 of the time (the tiny model's float8 step:
    42.7 s against 0.2 s in fp32 with ``_scaled_mm``, 2026-12-07)."""
    float8 = _torchao()
    skipped: dict[str, str] = {}
    converted: list[str] = []

    def keep(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear):
            return True  # containers: torchao asks about every module on its way down
        reason = skip_reason(name, module, tp)
        if reason:
            skipped[name] = reason
        else:
            converted.append(name)
        return reason is None

    float8.convert_to_float8_training(
        model, module_filter_fn=keep, config=linear_config(precision, fsdp_float8_all_gather, emulate)
    )
    return Conversion(precision, tuple(converted), tuple(skipped.items()))


def tp_style(precision: str | None, linear: nn.Module, kind: str, sp: bool, device_type: str) -> type:
    """The TP style of ``linear`` (``kind`` "colwise" or "rowwise"): torchao's float8 one for a float8
    linear under tensorwise scaling, torch's otherwise (the rowwise recipe: torchtitan enables float8
    TP for tensorwise only). Under SP on CPU, a float8 row-parallel linear takes torch's style: its
    backward would all-gather the float8 output gradient, and gloo has no float8 collectives
    (measured: "Invalid scalar type"); the cast then follows the all-gather, with the same scale."""
    if precision == "fp8" and is_float8_linear(linear) and (kind == "colwise" or not sp or device_type == "cuda"):
        # optional: torchao is the fp8 extra
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        return Float8ColwiseParallel if kind == "colwise" else Float8RowwiseParallel
    return ColwiseParallel if kind == "colwise" else RowwiseParallel


def region_input_style(precision: str | None, column_linears: list[nn.Module], sp: bool, device_type: str) -> type:
    """The style preparing a TP region's input (shared by its column-parallel ``column_linears``):
    torchao's ``PrepareFloat8ModuleInput`` when all of them are float8 under tensorwise scaling (the
    input is cast once, before the sequence-parallel all-gather), torch's ``PrepareModuleInput`` else,
    and under SP on CPU (gloo cannot all-gather float8; each linear casts the gathered input, with
    the same tensorwise scale: its amax is over the whole tensor either way)."""
    float8_input = precision == "fp8" and column_linears and all(is_float8_linear(m) for m in column_linears)
    if float8_input and (not sp or device_type == "cuda"):
        from torchao.float8.float8_tensor_parallel import PrepareFloat8ModuleInput  # optional: the fp8 extra

        return PrepareFloat8ModuleInput
    return PrepareModuleInput


def is_float8_linear(module: nn.Module) -> bool:
    return isinstance(module, _torch_private.float8_linear_type())


def after_optimizer_step(modules: list[nn.Module]) -> None:
    """Each FSDP2-sharded float8 weight's scale for the next all-gather, in one all-reduce."""
    float8 = _torchao()
    for module in modules:
        float8.precompute_float8_dynamic_scale_for_fsdp(module)


def plain_state(state: dict) -> dict:
    """``state`` (a model or optimizer state dict) with FSDP2's float8-cast weights as the plain
    tensors they wrap: a checkpoint holds no torchao type, so any precision resumes or exports it."""
    return {k: _torch_private.float8_weight_plain(v) for k, v in state.items()}
