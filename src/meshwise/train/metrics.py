"""Per-step metrics: JSONL file, terminal progress (rich) or plain lines, TensorBoard when installed.

Definitions (one optimizer step of B sequences of s tokens on W devices, taking ``step_s``):

- ``tokens_per_s`` = B*s / step_s (global); ``tokens_per_s_per_device`` = that / W;
- ``tflops`` = model FLOPs of the step / step_s / 1e12, with model FLOPs from
  :func:`meshwise.cost.compute.model_flops` (3 x forward: matmuls + attention + head, no recompute);
- ``mfu`` = model FLOPs / step_s / (W * peak), peak = the accelerator profile's FLOP/s for the
  precision the runtime uses (fp32 on CPU, bf16 on GPU);
- ``compile_s`` (first step of a ``--compile`` run only): seconds ``torch.compile`` took, measured
  on a warm-up forward/backward before that step and not part of its ``step_s``;
- ``peak_mem_bytes``: the largest rank's peak. On CUDA the caching allocator's
  ``max_memory_allocated``; on CPU the bytes of the live parameter, gradient and optimizer-state
  tensors held by the rank (model states only: activations are not tracked on CPU).

Only rank 0 writes; the values it writes are global (loss and grad norm are all-reduced by the
runtime, the memory peak is all-reduced with MAX by the trainer).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from meshwise.cost.compute import model_flops
from meshwise.spec import ModelSpec
from meshwise.train.config import MetricsConfig


@dataclass(frozen=True)
class Throughput:
    """The fixed quantities of every step, for turning a step time into rates."""

    model: ModelSpec
    seq_len: int
    global_batch: int
    world: int
    peak_flops_per_s: float | None  # per device; None for an unknown accelerator

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def flops_per_step(self) -> float:
        return model_flops(self.model, self.seq_len, self.tokens_per_step)

    def rates(self, step_s: float) -> dict[str, float | None]:
        tokens_per_s = self.tokens_per_step / step_s
        flops_per_s = self.flops_per_step / step_s
        mfu = flops_per_s / (self.world * self.peak_flops_per_s) if self.peak_flops_per_s else None
        return {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / self.world,
            "tflops": flops_per_s / 1e12,
            "tflops_per_device": flops_per_s / 1e12 / self.world,
            "mfu": mfu,
        }


class MetricsLog:
    """Rank 0's sink: JSONL (appending, so a restarted run continues the file), console, TensorBoard."""

    def __init__(
        self,
        config: MetricsConfig,
        throughput: Throughput,
        total_steps: int,
        enabled: bool,
        stream: TextIO | None = None,
    ) -> None:
        self.config = config
        self.throughput = throughput
        self.total_steps = total_steps
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout  # the current one, not import time's
        self._file: TextIO | None = None
        self._tb = None
        self._progress = None
        self._task = None

    def begin(self, start_step: int) -> None:
        """Open the sinks once the starting step is known: a run from step 0 starts the JSONL file
        afresh, a resumed one appends to it (so a step logged before a crash appears again)."""
        if not self.enabled:
            return
        if self.config.file:
            Path(self.config.file).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.config.file, "a" if start_step else "w")
        if self.config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the 'tensorboard' extra

            self._tb = SummaryWriter(self.config.tensorboard)
        if self.stream.isatty():
            self._progress = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total_steps, completed=start_step, info="")

    def print(self, text: str) -> None:
        """A plain line for the console (above the progress bar on a terminal)."""
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def step(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        lr: float,
        step_s: float,
        peak_mem_bytes: int,
        eval_loss: float | None = None,
        compile_s: float | None = None,
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            **self.throughput.rates(step_s),
            "step_s": step_s,
            "peak_mem_bytes": peak_mem_bytes,
        }
        if eval_loss is not None:
            record["eval_loss"] = eval_loss
        if compile_s is not None:
            record["compile_s"] = compile_s
        if not self.enabled:
            return record
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            for key in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_s", "peak_mem_bytes", "eval_loss"):
                if record.get(key) is not None:
                    self._tb.add_scalar(f"train/{key}", record[key], step)
        mfu = f"{record['mfu']:.1%}" if record["mfu"] is not None else "n/a"
        info = f"loss {loss:.4f}  {record['tokens_per_s']:,.0f} tok/s  MFU {mfu}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        if (
            eval_loss is not None
            or self._progress is None
            and (step % self.config.log_every == 0 or step == self.total_steps)
        ):
            line = (
                f"step {step}/{self.total_steps}  loss {loss:.4f}  grad norm {grad_norm:.3f}  lr {lr:.3g}  "
                f"{record['tokens_per_s']:,.0f} tok/s  {record['tflops']:.3g} TFLOP/s  MFU {mfu}  "
                f"{step_s * 1e3:.0f} ms/step  peak {peak_mem_bytes / 2**20:.1f} MiB"
            )
            if eval_loss is not None:
                line += f"  eval loss {eval_loss:.4f}"
            self.print(line)
        return record

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
