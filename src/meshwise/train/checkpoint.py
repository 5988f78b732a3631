"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): sharded save, resharding load, atomic
commit, and the :class:`Checkpointer` that owns the policy (cadence, commit, keep-last, resume).

Commit protocol (folders and trust: :mod:`meshwise.train.checkpoint_files`):

1. rank 0 makes ``DIR/step-N.tmp`` with meshwise's partial marker; every rank writes its shards
   into it (DCP ``save``; its coordinator writes ``.metadata``);
2. a barrier; rank 0 writes ``meshwise.json`` into the temporary folder and fsyncs it;
3. rank 0 renames ``step-N.tmp`` to ``step-N`` (atomic on one file system) and fsyncs ``DIR``.

Only folders named ``step-N`` that hold ``meshwise.json`` count as complete, so a crash at any
point before step 3 leaves the previous checkpoint as the latest one.

Writing is DCP's ``async_save``: the state is first staged to host memory, then written by a
thread while the caller waits for it. A save asked for by a stop signal has a budget, what is left
of the launcher's grace (``--stop-grace``) less a margin to report and exit: it is not started
when the previous save took longer than that, and it is abandoned when the write outlasts it
(:class:`OutOfGrace`: the run ends in one line naming the latest complete checkpoint, before the
launcher's SIGKILL); its partial folder is never counted as complete. The last ``keep`` complete
checkpoints are kept.

Interval: every ``every`` steps, or under ``--checkpoint-every auto`` (:class:`AutoInterval`) from
the run's own saves: the first is taken ``AUTO_FIRST_SAVE`` steps into the attempt, its staging and
write are timed apart, and with the job's mean time between failures Daly's interval
(cost/failures.py) sets the steps to the next; a later save slower by more than
``AUTO_SLOWER`` sets it again. A save that runs out of space removes its partial folder and stops the run
in one line naming the folder and the space it needed.

What is saved: the model and optimizer state from ``get_state_dict`` with
``flatten_optimizer_state_dict=True`` (one key per parameter FQN and state: ``state.<fqn>.exp_avg``,
``param_groups.<fqn>.lr``), and the run state (step, samples consumed, RNG). Parameter names are
the plain model's (``layers.3.mlp.w1.weight``) under every layout: a pipeline rank holds a subset,
TP/FSDP shards are DTensors, activation-checkpointing wrappers are removed from the names. DCP
reshards on load, so a run resumes under any layout or world size.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from meshwise.cost import failures
from meshwise.cost.failures import daly_interval_s
from meshwise.errors import MeshwiseError, RunStopped
from meshwise.runtime import float8
from meshwise.runtime.model import Transformer, canonical_name
from meshwise.spec import ModelSpec
from meshwise.train.checkpoint_files import (  # noqa: F401
    COMMIT_FILE,
    PARTIAL_FILE,
    complete_checkpoints,
    latest,
    model_spec,
    own_folders,
    read_dcp_metadata,
    read_meta,
    remove_own,
    step_dir,
    verify,
)

SHAPE_FIELDS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "mlp",
    "vocab",
    "tied_embeddings",
    "family",
    "head_dim",
    "norm",
    "position",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "qk_norm",
)
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


# ----------------------------------------------------------------------------------- policy
def model_meta(spec: ModelSpec) -> dict[str, Any]:
    return {k: v for k, v in asdict(spec).items() if k != "param_count"}


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """DCP keys and shapes of the model's weights (built on the meta device: no memory, instant)."""
    with torch.device("meta"):
        model = Transformer(spec)
    return {f"model.{name}": tuple(p.shape) for name, p in model.named_parameters()}


def check_shape(meta: dict[str, Any], spec: ModelSpec, path: str | Path) -> None:
    """Refuse a checkpoint of another model shape, naming the first field that differs."""
    saved = meta.get("model", {})
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    defaults["head_dim"] = saved.get("hidden", 0) // max(1, saved.get("heads", 1))  # before head_dim was saved
    for name in SHAPE_FIELDS:
        value = saved.get(name, defaults[name])
        if value != getattr(spec, name):
            raise MeshwiseError(
                f"checkpoint {path}: its {COMMIT_FILE} has {name}={value!r}, but this run's "
                f"model {spec.name!r} has {name}={getattr(spec, name)!r}"
            )


def verify_sound(path: Path) -> None:
    """A checkpoint that is sound by itself: files present and whole, and its weights shaped as
    its own meshwise.json says (checked on the meta device, before any memory is spent)."""
    verify(path, expected_shapes(model_spec(path, read_meta(path))))


def resolve_resume(resume: str, root: str) -> tuple[Path | None, list[str]]:
    """(checkpoint to resume from, notes to print).

    ``""`` -> None (fresh run); ``"auto"`` -> the newest complete checkpoint in ``root`` that is
    sound (a damaged newer one is passed over, with a note saying so; None if there is none);
    otherwise the named checkpoint folder, which must be complete and sound."""
    if not resume:
        return None, []
    if resume != "auto":
        path = Path(resume)
        verify_sound(path)
        return path, []
    notes: list[str] = []
    for _, path in reversed(complete_checkpoints(root) if root else []):
        try:
            verify_sound(path)
        except MeshwiseError as e:
            notes.append(f"--resume auto: passing over {path.name}: {e}")
            continue
        if notes:
            notes.append(f"--resume auto: falling back to {path}")
        return path, notes
    return None, notes


def refuse_or_clear(root: str, overwrite: bool, clear: bool) -> None:
    """A fresh run into ``root``: refused if it holds meshwise checkpoints, unless ``overwrite``;
    then (``clear``) meshwise's own folders, and only those, are removed."""
    own = own_folders(root) if root else []
    if not own:
        return
    if not overwrite:
        newest = latest(root)
        held = f"latest {newest.name}" if newest else f"{len(own)} partial"
        raise MeshwiseError(
            f"--checkpoint.dir: {root} already holds checkpoints ({held}); continue them with "
            "--resume auto, or start over with --checkpoint.overwrite true"
        )
    if clear:
        for p in own:
            remove_own(p)


# --------------------------------------------------------------------------------- state dicts
class _Chunks(nn.Module):
    """This rank's pipeline chunks as one module with the plain model's parameter names (the chunks'
    own submodules, registered again; nothing is copied)."""

    def __init__(self, chunks: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        for chunk in chunks:
            for name in ("tok_embeddings", "pos_embeddings", "norm", "output"):
                if getattr(chunk, name, None) is not None:
                    setattr(self, name, getattr(chunk, name))
            for key, block in chunk.layers.items():
                self.layers[key] = block


def _canonical(sd: dict[str, Any]) -> dict[str, Any]:
    return {canonical_name(k): v for k, v in sd.items()}


def _restore_names(canonical: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    return {k: canonical[canonical_name(k)] for k in template}


def _states(modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> tuple[nn.Module, dict, dict]:
    container = _Chunks(modules)
    model_sd, optim_sd = get_state_dict(container, optimizer, options=_OPTIONS)
    return container, model_sd, optim_sd


def _local_bytes(state: dict[str, Any]) -> int:
    total = 0
    for v in state.values():
        if isinstance(v, dict):
            total += _local_bytes(v)
        elif isinstance(v, torch.Tensor):
            local = v.to_local() if hasattr(v, "to_local") else v
            total += local.numel() * local.element_size()
    return total


def _cause(e: BaseException) -> str:
    """The first rank's underlying exception type (DCP wraps every rank's failure)."""
    if isinstance(e, dcp.CheckpointException) and e.failures:
        inner = next(iter(e.failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        return type(inner).__name__
    return type(e).__name__


def _is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(e) or "Disk quota exceeded" in str(e)


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, with ``.metadata`` read by meshwise's restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:  # per-rank metadata: meshwise never writes it
            raise MeshwiseError(f"checkpoint {self.path}: per-rank metadata is not meshwise's format")
        metadata = read_dcp_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _dcp_load(state: dict[str, Any], path: Path, no_dist: bool = False) -> None:
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=_Reader(str(path)), no_dist=no_dist)
    except MeshwiseError:
        raise
    except (Exception, dcp.CheckpointException) as e:  # garbage inside a shard that verify() could not see
        raise MeshwiseError(f"checkpoint {path}: a shard (*.distcp) is damaged ({_cause(e)})") from None


def load(
    modules: list[nn.Module], optimizer: torch.optim.Optimizer, path: str | Path, run_state: dict[str, Any]
) -> dict[str, Any]:
    """Load model, optimizer and run state from ``path`` into this rank's shards (DCP reshards).

    ``run_state`` is the template of the run state (its keys and types); the loaded one is returned.
    """
    container, model_sd, optim_sd = _states(modules, optimizer)  # initialises the optimizer states
    state = {"model": _canonical(model_sd), "optim": _canonical(optim_sd), "run": dict(run_state)}
    _dcp_load(state, Path(path))
    set_state_dict(
        container,
        optimizer,
        model_state_dict=_restore_names(state["model"], model_sd),
        optim_state_dict=_restore_names(state["optim"], optim_sd),
        options=_OPTIONS,
    )
    return state["run"]


def load_full_model(path: str | Path, model: nn.Module) -> None:
    """Fill a plain single-process model from a checkpoint (no process group needed, or used)."""
    state = {"model": model.state_dict()}
    _dcp_load(state, Path(path), no_dist=True)
    model.load_state_dict(state["model"])


# ------------------------------------------------------------------------------- checkpointer
AUTO_FIRST_SAVE = 3  # steps into an attempt of the first save under --checkpoint-every auto (its cost is measured)
AUTO_SLOWER = 1.25  # a save this much slower than the one the interval came from sets the interval again


@dataclass
class AutoInterval:
    """``--checkpoint-every auto``: the job's mean time between failures and where it comes from; the
    save cost (staging + write: the run waits for both) and the step time the interval came from."""

    mtbf_s: float
    why: str
    delta_s: float = 0.0  # 0: no save measured yet
    step_times_s: list[float] = field(default_factory=list)

    def step_s(self) -> float:
        """The median of the attempt's step times, its first (warm-up) left out when there are others."""
        times = sorted(self.step_times_s[1:] or self.step_times_s)
        return times[len(times) // 2]

    def derive(self, step: int, stage_s: float, write_s: float, step_s: float) -> tuple[int, str] | None:
        """The interval in steps and the line that says why, after the save of ``step`` (the figures
        agreed over the ranks: the slowest's); None when the interval stands (this save not slower than
        ``AUTO_SLOWER`` times the one it came from)."""
        delta_s = stage_s + write_s
        if self.delta_s and delta_s <= AUTO_SLOWER * self.delta_s:
            return None
        again = bool(self.delta_s)
        self.delta_s = delta_s
        tau_s = daly_interval_s(delta_s, self.mtbf_s)
        every = max(1, round(tau_s / step_s))
        head = "re-derived, the save was slower" if again else "auto"
        return every, (
            f"Checkpoint interval ({head}): every {every} steps ({every * step_s:.3g} s): the save of step "
            f"{step} took {delta_s:.3g} s (staging {stage_s:.3g} s, write {write_s:.3g} s; training waits "
            f"for both), one failure every {_duration(self.mtbf_s)} ({self.why}); Daly's interval "
            f"{tau_s:.3g} s / {step_s:.3g} s per step"
        )


def _duration(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min" if seconds >= 120 else f"{seconds:.3g} s"


def auto_mtbf(failure_rate: float, mtbf_hours: float, devices: int, nodes: int) -> tuple[float, str]:
    """(seconds, source) of the job's mean time between failures: ``--mtbf-hours``, else
    ``--failure-rate`` per device-hour, else the catalog's per GPU, node and NIC (one NIC per device)."""
    if mtbf_hours:
        return mtbf_hours * 3600, "--mtbf-hours"
    if failure_rate:
        return failures.job_mtbf_s(
            failures.flat_rates(failure_rate), None, devices, nodes, devices
        ), f"--failure-rate {failure_rate:g} per device-hour x {devices} device(s)"
    return failures.job_mtbf_s(
        failures.catalog_rates(), None, devices, nodes, devices
    ), f"the catalog's rate for {devices} device(s) on {nodes} node(s)"


class OutOfGrace(Exception):
    """A stop save that does not fit the grace: not started (``in_flight`` False) or abandoned while
    DCP's thread still writes (``in_flight`` True: the process must exit without collectives)."""

    def __init__(self, message: str, in_flight: bool) -> None:
        super().__init__(message)
        self.in_flight = in_flight


def grace_margin_s(grace_s: float) -> float:
    """What a stop save leaves of the grace to report and exit: a tenth, between 0.5 and 3 s."""
    return min(3.0, max(0.5, 0.1 * grace_s))


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer, calling ``before_write(step)`` first in the writing thread (test faults)."""

    def __init__(self, path: str, step: int, before_write: Callable[[int], None] | None) -> None:
        super().__init__(path)
        self._step, self._before_write = step, before_write

    def write_data(self, *args: Any, **kwargs: Any) -> Any:
        if self._before_write is not None:
            self._before_write(self._step)
        return super().write_data(*args, **kwargs)


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Checkpointer:
    """When to save (every ``every`` steps and at the last), how to commit, how many to keep.
    Collective: every rank calls :meth:`save` with the same arguments."""

    root: str  # "" = no checkpoints
    every: int
    keep: int
    modules: list[nn.Module]
    optimizer: torch.optim.Optimizer
    meta: dict[str, Any]
    before_commit: Callable[[int], None] | None = None
    before_write: Callable[[int], None] | None = None
    grace_s: float = 30.0  # the launcher's grace after a stop signal (--stop-grace)
    last_saved: int = 0
    last_save_s: float = 0.0  # the slowest rank's time for the previous save (0: none yet)
    auto: AutoInterval | None = None  # --checkpoint-every auto: ``every`` is set from the measured saves
    say: Callable[[str], None] | None = None  # prints the auto interval's line (rank 0's log)
    _cpu_group: Any = None  # async_save's process group: the default one if it has a CPU backend, else gloo

    def due(self, step: int, last: bool) -> bool:
        if not self.root or last:
            return bool(self.root)
        if self.auto is not None:
            since = step - self.last_saved
            return since >= (self.every if self.auto.delta_s else AUTO_FIRST_SAVE)
        return bool(self.every) and step % self.every == 0

    def save(
        self,
        step: int,
        last: bool,
        run_state: dict[str, Any],
        force: bool = False,
        stop_age_s: float | None = None,
        step_s: float | None = None,
    ) -> Path | None:
        """Save ``step`` if it is due (or ``force``); returns the committed folder or None.
        ``stop_age_s``: a stop save, that many seconds (the same on every rank) into the grace;
        ``step_s``: the step's time (the auto interval's unit)."""
        if self.auto is not None and step_s is not None:
            self.auto.step_times_s.append(step_s)
        if not (self.due(step, last) or force and self.root):
            return None
        budget_s = None
        if stop_age_s is not None:
            budget_s = self.grace_s - stop_age_s - grace_margin_s(self.grace_s)
            if self.last_save_s > budget_s:
                raise OutOfGrace(
                    f"the save of step {step} was not started: the previous save took "
                    f"{self.last_save_s:.1f} s, more than the {max(0.0, budget_s):.1f} s left of the "
                    f"{self.grace_s:g} s grace (--stop-grace); {self._latest_line()}",
                    in_flight=False,
                )
        started = time.monotonic()
        root, rank = Path(self.root), dist.get_rank()
        tmp, final = root / f"step-{step}.tmp", step_dir(root, step)
        _, model_sd, optim_sd = _states(self.modules, self.optimizer)
        state = {
            "model": _canonical(float8.plain_state(model_sd)),
            "optim": _canonical(float8.plain_state(optim_sd)),
            "run": run_state,
        }
        needed = torch.tensor([_local_bytes(state)], dtype=torch.int64)
        dist.all_reduce(needed)
        try:
            if rank == 0:
                root.mkdir(parents=True, exist_ok=True)
                if tmp in own_folders(root):
                    remove_own(tmp)  # left by an earlier crash
                tmp.mkdir()
                (tmp / PARTIAL_FILE).write_text("")
            dist.barrier()
            parts = self._write(state, tmp, step, budget_s, started)
            dist.barrier()
            if self.before_commit is not None:
                self.before_commit(step)
            if rank == 0:
                self._commit(tmp, final, step)
        except (Exception, dcp.CheckpointException) as e:
            _raise_if_disk_full(e, root, tmp, step, int(needed.item()))
            raise
        self._record(step, time.monotonic() - started, parts)
        return final

    def _record(self, step: int, took_s: float, parts: Any) -> None:
        """After a committed save (collective): the slowest rank's save time, and under
        ``--checkpoint-every auto`` the interval derived from it."""
        step_s = self.auto.step_s() if self.auto is not None and self.auto.step_times_s else 0.0
        took = torch.tensor([took_s, *parts, step_s], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the barrier, and every rank's slowest times
        self.last_saved, self.last_save_s = step, float(took[0].item())
        if self.auto is not None and took[3].item() > 0:
            derived = self.auto.derive(step, float(took[1].item()), float(took[2].item()), float(took[3].item()))
            if derived is not None:
                self.every = derived[0]
                if self.say is not None:
                    self.say(derived[1])

    def _write(
        self, state: dict[str, Any], tmp: Path, step: int, budget_s: float | None, started: float
    ) -> tuple[float, float]:
        """Stage ``state`` to host memory and write it (DCP ``async_save``), waiting for the write at
        most what is left of ``budget_s`` (None: as long as it takes); (staging, write) seconds."""
        if self._cpu_group is None:  # DCP's async_save coordinates over a CPU backend (NCCL has none)
            self._cpu_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        t0 = time.monotonic()
        future = dcp.async_save(
            state, storage_writer=_Writer(str(tmp), step, self.before_write), process_group=self._cpu_group
        )
        t1 = time.monotonic()
        left = None if budget_s is None else max(0.0, budget_s - (time.monotonic() - started))
        try:
            future.result(timeout=left)
        except concurrent.futures.TimeoutError:
            raise OutOfGrace(
                f"the {self.grace_s:g} s grace (--stop-grace) was too short for the save of step "
                f"{step} (still writing after {time.monotonic() - started:.1f} s; {tmp.name} is "
                f"partial); {self._latest_line()}",
                in_flight=True,
            ) from None
        return t1 - t0, time.monotonic() - t1

    def _latest_line(self) -> str:
        previous = latest(self.root)
        if previous is None:
            return "no checkpoint is complete"
        return f"the latest complete checkpoint is {previous}; --resume auto continues from it"

    def _commit(self, tmp: Path, final: Path, step: int) -> None:
        marker = tmp / COMMIT_FILE
        with open(marker, "w") as f:
            json.dump({**self.meta, "step": step}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        (tmp / PARTIAL_FILE).unlink()
        if final in own_folders(final.parent):
            remove_own(final)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        for _, old in complete_checkpoints(final.parent)[: -self.keep]:
            remove_own(old)

    def restore(self, path: Path, run_state: dict[str, Any]) -> dict[str, Any]:
        run_state = load(self.modules, self.optimizer, path, run_state)
        self.last_saved = int(run_state["step"])
        return run_state


def _raise_if_disk_full(e: BaseException, root: Path, tmp: Path, step: int, tensors_bytes: int) -> None:
    """A save that failed for want of room ends the run in one line (the partial folder removed);
    any other failure returns for the caller to re-raise."""
    previous = latest(root)
    need_bytes = _folder_bytes(previous) if previous else tensors_bytes
    # torch's writer can fail on a short write without ENOSPC ("unexpected pos"): a disk
    # left with less than one checkpoint's room is the cause then
    if not (_is_disk_full(e) or root.exists() and shutil.disk_usage(root).free < need_bytes):
        return
    if dist.get_rank() == 0 and tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    free = shutil.disk_usage(root).free if root.exists() else 0
    need = (
        f"about {need_bytes / 1e6:,.1f} MB (the size of {previous.name})"
        if previous
        else f"more than {need_bytes / 1e6:,.1f} MB (its tensors alone)"
    )
    where = f"the last complete one is {previous.name}" if previous else "no checkpoint is complete"
    raise RunStopped(
        f"--checkpoint.dir: no space left in {root} while saving step {step}: it needs {need}, "
        f"{free / 1e6:,.1f} MB are free; the partial {tmp.name} was removed and {where}",
        1,
    ) from None
