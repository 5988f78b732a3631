"""The training configuration: a TOML file, then command-line overrides, resolved into frozen dataclasses.

Sections (each a frozen dataclass below): ``model``, ``data``, ``layout``, ``optimizer``,
``schedule``, ``checkpoint``, ``metrics``, ``generate``. Every field ``F`` of section ``S`` is set in
the file as ``[S] F = value`` and on the command line as ``--S.F value`` (a few common ones also
have a short alias, :data:`ALIASES`). Unknown sections or keys and values of the wrong type are
refused in one line (:class:`~meshwise.errors.MeshwiseError`, exit status 2).

Pure Python: no torch import, so ``meshwise train --print-config`` is instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from meshwise.errors import MeshwiseError
from meshwise.files import read_toml
from meshwise.spec.optimizer import OptimizerConfig
from meshwise.spec.train import PRECISIONS


@dataclass(frozen=True)
class ModelConfig:
    name: str = "small"  # catalog name, model TOML, or Hugging Face config.json
    seed: int = 0  # weight initialisation seed (every layout starts from the same weights)
    pretrained: str = ""  # a Hugging Face folder (config.json + safetensors) to fine-tune from (--model.from)


@dataclass(frozen=True)
class DataConfig:
    path: str = ""  # "" = the embedded corpus; else a text file, a folder of them, or a .bin token array
    bin_dtype: str = "uint16"  # element type of .bin token arrays: uint16 or uint32
    seq_len: int = 128  # tokens per training sequence
    seed: int = 1234  # sample-order seed: sample g of the run depends only on (seed, g)
    eval_fraction: float = 0.05  # share of the sequences held out for the eval loss
    tokenizer: str = ""  # "" = bytes; else a Hugging Face tokenizer.json or the folder holding one
    text_field: str = "text"  # the text column of .jsonl / .parquet data (with a tokenizer)


@dataclass(frozen=True)
class LayoutConfig:
    choice: str = "auto"  # "auto" (the planner decides for the live cluster) or a layout text, e.g. "dp=2,tp=2"
    profile: str = ""  # "" = the catalog profile of the device; else a `meshwise calibrate` .toml for auto
    compile: bool = False  # torch.compile each block (pp=1, tp=1 layouts); compile time is reported apart
    precision: str = "auto"  # auto: the device's (CPU fp32, GPU bf16 + fp32 master); fp8, fp8-rowwise: torchao float8


@dataclass(frozen=True)
class ScheduleConfig:
    steps: int = 100  # optimizer steps in the run
    global_batch: int = 8  # sequences per optimizer step (= mbs * accum * dp)
    warmup_steps: int = 10  # linear warm-up from 0 to lr
    eval_every: int = 25  # steps between eval losses (0: only at the end)
    eval_batches: int = 2  # global batches of held-out sequences per eval


EVERY_WORDS = ("auto", "default")  # checkpoint.every's words beside a number of steps
DEFAULT_EVERY_STEPS = 50  # checkpoint.every = "default" on one node


class IntOrWord:
    """The type of a field that is a whole number or one of :data:`EVERY_WORDS`."""


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = "runs/checkpoints"  # "" = no checkpoints
    # steps between checkpoints (0: only at the end); "auto": from the measured cost of the run's own saves and
    # the failure rate (Daly's interval); "default": auto on more than one node, else 50
    every: int | str = "default"
    keep: int = 3  # complete checkpoints kept (oldest removed first)
    resume: str = ""  # "" fresh run, "auto" latest complete checkpoint in dir, or a checkpoint folder
    overwrite: bool = False  # a fresh run into a dir holding checkpoints: remove meshwise's own folders there
    stop_grace: float = 30.0  # seconds from a stop signal (SIGTERM) to the launcher's SIGKILL (torch's default 30)
    failure_rate: float = (
        0.0  # for every = auto: interruptions per device-hour (0: the catalog's, catalog/failures.toml)
    )
    mtbf_hours: float = 0.0  # for every = auto: the whole job's mean time between failures (0: from the rate)


@dataclass(frozen=True)
class MetricsConfig:
    file: str = ""  # JSONL metrics, one line per step (rank 0)
    log_every: int = 10  # steps between plain-text log lines (when not on a terminal)
    tensorboard: str = ""  # TensorBoard log folder (needs the 'tensorboard' extra)


@dataclass(frozen=True)
class GenerateConfig:
    prompt: str = "12 + 7 ="  # printed sample at the end of the run ("" = none)
    tokens: int = 120  # tokens to generate (bytes with the byte tokenizer; fewer at eos)
    temperature: float = 0.8
    top_k: int = 20
    seed: int = 0


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(TrainConfig)}  # type: ignore[misc]

# Short command-line spellings of the most used fields.
ALIASES: dict[str, str] = {
    "--model": "model.name",
    "--model.from": "model.pretrained",
    "--data": "data.path",
    "--seq-len": "data.seq_len",
    "--layout": "layout.choice",
    "--precision": "layout.precision",
    "--lr": "optimizer.lr",
    "--steps": "schedule.steps",
    "--global-batch": "schedule.global_batch",
    "--eval-every": "schedule.eval_every",
    "--checkpoint-dir": "checkpoint.dir",
    "--checkpoint-every": "checkpoint.every",
    "--keep": "checkpoint.keep",
    "--resume": "checkpoint.resume",
    "--stop-grace": "checkpoint.stop_grace",
    "--failure-rate": "checkpoint.failure_rate",
    "--mtbf-hours": "checkpoint.mtbf_hours",
    "--metrics": "metrics.file",
    "--prompt": "generate.prompt",
}


def field_type(section: str, name: str) -> type:
    """The Python type of ``section.name`` (the annotations are strings under postponed evaluation)."""
    for f in fields(SECTIONS[section]):
        if f.name == name:
            return {"int": int, "float": float, "str": str, "bool": bool, "int | str": IntOrWord}[str(f.type)]
    raise KeyError(name)


def _check_value(where: str, value: Any, kind: type) -> Any:
    """TOML values must have the field's type; an integer is accepted where a float is expected."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is IntOrWord:
        if isinstance(value, int) and not isinstance(value, bool) or value in EVERY_WORDS:
            return value
        raise MeshwiseError(
            f"{where}: expected a whole number of steps or one of {', '.join(EVERY_WORDS)}, got {value!r}"
        )
    if kind is not bool and isinstance(value, bool) or not isinstance(value, kind):
        raise MeshwiseError(f"{where}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse_text(where: str, text: str, kind: type) -> Any:
    """A command-line string converted to the field's type."""
    try:
        if kind is IntOrWord:
            return text if text in EVERY_WORDS else int(text)
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise ValueError
            return text.lower() in ("true", "1", "on")
        return kind(text)
    except ValueError:
        valid = f"whole number or one of {', '.join(EVERY_WORDS)}" if kind is IntOrWord else kind.__name__
        raise MeshwiseError(f"{where}: {text!r} is not a valid {valid}") from None


def _valid_keys(section: str) -> str:
    return ", ".join(f.name for f in fields(SECTIONS[section]))


def from_table(table: dict[str, Any], where: str = "config") -> TrainConfig:
    """A config from a parsed TOML table; every key must be known and every value of its type."""
    sections: dict[str, Any] = {}
    for name, body in table.items():
        if name not in SECTIONS:
            raise MeshwiseError(f"{where}: unknown section [{name}]; valid sections: {', '.join(SECTIONS)}")
        if not isinstance(body, dict):
            raise MeshwiseError(f"{where}: {name} must be a [{name}] table, got {type(body).__name__}")
        values = {}
        for key, value in body.items():
            try:
                kind = field_type(name, key)
            except KeyError:
                raise MeshwiseError(
                    f"{where}: unknown key {name}.{key}; valid keys of [{name}]: {_valid_keys(name)}"
                ) from None
            values[key] = _check_value(f"{where}: {name}.{key}", value, kind)
        sections[name] = SECTIONS[name](**values)
    return TrainConfig(**sections)


def load(path: str | None) -> TrainConfig:
    """The defaults, or the defaults updated by a TOML file."""
    if not path:
        return TrainConfig()
    return from_table(read_toml(Path(path), "--config"), f"config {path}")


def override(config: TrainConfig, dotted: str, text: str) -> TrainConfig:
    """``config`` with ``section.field`` set from command-line text."""
    section, _, name = dotted.partition(".")
    if section not in SECTIONS:
        raise MeshwiseError(f"--{dotted}: unknown section {section!r}; valid sections: {', '.join(SECTIONS)}")
    try:
        kind = field_type(section, name)
    except KeyError:
        raise MeshwiseError(f"--{dotted}: unknown key; valid keys of {section}: {_valid_keys(section)}") from None
    value = _parse_text(f"--{dotted}", text, kind)
    return replace(config, **{section: replace(getattr(config, section), **{name: value})})


def check(config: TrainConfig) -> None:
    """Ranges that no type check catches."""
    _check_counts(config)
    _check_names(config)
    _check_finite(config)
    _check_checkpoint(config.checkpoint)
    _check_optimizer(config.optimizer)
    d, g = config.data, config.generate
    if not 0 < d.eval_fraction < 1:
        raise MeshwiseError(f"--data.eval_fraction: {d.eval_fraction} must be in (0, 1)")
    if d.bin_dtype not in ("uint16", "uint32"):
        raise MeshwiseError(f"--data.bin_dtype: {d.bin_dtype!r} must be uint16 or uint32")
    if g.temperature < 0:
        raise MeshwiseError(f"--generate.temperature: {g.temperature} must not be negative")
    for name, seed in {"model.seed": config.model.seed, "data.seed": d.seed, "generate.seed": g.seed}.items():
        check_seed(f"--{name}", seed)
    check_text("--generate.prompt", g.prompt)
    check_precision(config.layout.precision)


def _check_counts(config: TrainConfig) -> None:
    """Counts that must be at least 1, and those that must not be negative."""
    s, d, c, m, g = config.schedule, config.data, config.checkpoint, config.metrics, config.generate
    # --steps 0 with --model.from converts the pretrained weights into a checkpoint and stops.
    if s.steps == 0 and config.model.pretrained:
        s = replace(s, steps=1)
    positive = {
        "schedule.steps": s.steps,
        "schedule.global_batch": s.global_batch,
        "data.seq_len": d.seq_len,
        "schedule.eval_batches": s.eval_batches,
        "checkpoint.keep": c.keep,
        "metrics.log_every": m.log_every,
    }
    for name, value in positive.items():
        if value < 1:
            raise MeshwiseError(f"--{name}: {value} must be at least 1")
    for name, value in {
        "schedule.warmup_steps": s.warmup_steps,
        "schedule.eval_every": s.eval_every,
        "checkpoint.every": c.every if isinstance(c.every, int) else 0,
        "generate.tokens": g.tokens,
        "generate.top_k": g.top_k,
    }.items():
        if value < 0:
            raise MeshwiseError(f"--{name}: {value} must not be negative")


def _check_names(config: TrainConfig) -> None:
    """The layout and the model are named."""
    if not config.layout.choice.strip():
        raise MeshwiseError("--layout.choice: an empty value; give auto or key=value pairs, e.g. dp=2,zero=3")
    if not config.model.name.strip() and not config.model.pretrained:
        raise MeshwiseError(
            "--model.name: an empty value; give a catalog name (e.g. small), a model .toml or a "
            "Hugging Face config.json"
        )


def _check_finite(config: TrainConfig) -> None:
    """Every real-valued field is a finite number."""
    o, d, g = config.optimizer, config.data, config.generate
    for name, value in {
        "optimizer.lr": o.lr,
        "optimizer.min_lr": o.min_lr,
        "optimizer.beta1": o.beta1,
        "optimizer.beta2": o.beta2,
        "optimizer.eps": o.eps,
        "optimizer.weight_decay": o.weight_decay,
        "optimizer.grad_clip": o.grad_clip,
        "data.eval_fraction": d.eval_fraction,
        "generate.temperature": g.temperature,
    }.items():
        if not math.isfinite(value):
            raise MeshwiseError(f"--{name}: {value} must be a finite number")


def _check_checkpoint(c: CheckpointConfig) -> None:
    """The failure model (one of rate or MTBF) and the stop grace."""
    for name, value in {"checkpoint.failure_rate": c.failure_rate, "checkpoint.mtbf_hours": c.mtbf_hours}.items():
        if not (math.isfinite(value) and value >= 0):
            raise MeshwiseError(f"--{name}: {value} must be a finite number, 0 (the default) or more")
    if c.failure_rate and c.mtbf_hours:
        raise MeshwiseError("--checkpoint.mtbf_hours: give it or --checkpoint.failure_rate, not both")
    if not (math.isfinite(c.stop_grace) and 1 <= c.stop_grace <= 86400):
        raise MeshwiseError(f"--checkpoint.stop_grace: {c.stop_grace} must be a number of seconds in [1, 86400]")


def _check_optimizer(o: OptimizerConfig) -> None:
    """AdamW's ranges: 0 <= min_lr <= lr, betas in [0, 1), eps > 0, decay >= 0, clip > 0."""
    if o.lr <= 0 or o.min_lr < 0 or o.min_lr > o.lr:
        raise MeshwiseError(
            f"--optimizer.lr/min_lr: need 0 <= min_lr <= lr and lr > 0, got lr={o.lr}, min_lr={o.min_lr}"
        )
    for name, beta in (("beta1", o.beta1), ("beta2", o.beta2)):
        if not 0 <= beta < 1:
            raise MeshwiseError(f"--optimizer.{name}: {beta} must be in [0, 1)")
    if o.eps <= 0:
        raise MeshwiseError(f"--optimizer.eps: {o.eps} must be positive")
    if o.weight_decay < 0:
        raise MeshwiseError(f"--optimizer.weight_decay: {o.weight_decay} must not be negative")
    if o.grad_clip <= 0:
        raise MeshwiseError(f"--optimizer.grad_clip: {o.grad_clip} must be positive")


def check_precision(precision: str) -> None:
    """A known precision name (whether this device runs it is the runtime's check, at start)."""
    if precision != "auto" and precision not in PRECISIONS:
        raise MeshwiseError(f"--layout.precision: {precision!r} is not one of auto, {', '.join(PRECISIONS)}")


def check_seed(field: str, seed: int) -> None:
    """Seeds are what ``torch.manual_seed`` takes: 0 <= seed < 2**64."""
    if not 0 <= seed < 2**64:
        raise MeshwiseError(f"{field}: {seed} must be in [0, 2**64)")


def check_text(field: str, text: str) -> None:
    """Text that will be encoded as UTF-8 (command-line bytes that were not UTF-8 arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MeshwiseError(f"{field}: not valid UTF-8 text") from None


def to_toml(config: TrainConfig) -> str:
    """The resolved config as TOML (what ``--print-config`` shows; loading it gives the same config)."""
    lines: list[str] = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        body = getattr(config, section)
        for f in fields(body):
            lines.append(f"{f.name} = {_toml_value(getattr(body, f.name))}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return repr(value)
