"""One worker's training run: preflight, layout, model, resume, steps, evals, checkpoints, sample.

Step numbers count optimizer steps from 1; checkpoint ``step-N`` holds the state after step N.
Learning rate at step k (warm-up W, total T, peak lr, floor min_lr), the usual linear warm-up and
half-cosine decay (Loshchilov & Hutter 2017, without restarts):

    lr(k) = lr * k / W                                               for k <= W
    lr(k) = min_lr + (lr - min_lr) * (1 + cos(pi * (k - W) / (T - W))) / 2   otherwise

A non-finite loss or gradient norm (both global, so every rank sees the same value) stops the run
before anything of that state is written.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from meshwise import files
from meshwise.errors import MeshwiseError, RunStopped
from meshwise.launch import init_process_group, report
from meshwise.layout import Layout, check_seq_len
from meshwise.runtime import build_mesh, float8, parallelize
from meshwise.runtime.compile import warm_up
from meshwise.runtime.mesh import dp_rank, end_process_group, mesh_device
from meshwise.runtime.model import runtime_refusal
from meshwise.spec import ModelSpec, load_model
from meshwise.train import checkpoint, faults, layout_choice, pretrained
from meshwise.train.config import DEFAULT_EVERY_STEPS, OptimizerConfig, ScheduleConfig, TrainConfig, check
from meshwise.train.data import Corpus, build_corpus, describe_source
from meshwise.train.export import load_plain_model
from meshwise.train.generate import sample
from meshwise.train.metrics import MetricsLog, Throughput


@dataclass(frozen=True)
class Debug:
    """Hidden test hooks (see :mod:`meshwise.train.faults`)."""

    inject_nan_at_step: int | None = None


@dataclass(frozen=True)
class Prepared:
    """What every process (launcher and workers) checks before any process group exists."""

    model: ModelSpec
    corpus: Corpus
    resume: Path | None
    notes: tuple[str, ...] = ()  # what --resume auto passed over, to print once


def lr_at(step: int, schedule: ScheduleConfig, optimizer: OptimizerConfig) -> float:
    warm = schedule.warmup_steps
    if warm and step <= warm:
        return optimizer.lr * step / warm
    span = max(1, schedule.steps - warm)
    progress = min(1.0, (step - warm) / span)
    return optimizer.min_lr + (optimizer.lr - optimizer.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def restart_attempt() -> int:
    """Which attempt of the same run this is (torchrun's ``TORCHELASTIC_RESTART_COUNT``; 0 first)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def check_batch_in_corpus(global_batch: int, corpus: Corpus) -> None:
    """A step reads each training sequence at most once: a global batch past the training set's
    sequences is refused (it would only repeat them, and its loader's work grows with the batch)."""
    if global_batch > corpus.n_train:
        raise MeshwiseError(
            f"--schedule.global_batch: {global_batch} sequences per step is more than the training "
            f"set's {corpus.n_train:,} sequences of {corpus.seq_len} tokens; use at most "
            f"{corpus.n_train:,}, or more data (--data.path)"
        )


def preflight(cfg: TrainConfig, local_ranks: int | None = None) -> Prepared:
    """Every check that needs no process group: config ranges, model, data, resume point, extras.

    A restarted attempt (``--max-restarts``) of a run with checkpoints resumes its own latest one
    (``--resume auto``), whatever the first attempt was given."""
    check(cfg)
    if cfg.model.pretrained:
        model = pretrained.check_folder(cfg.model.pretrained)
    else:
        model = load_model(cfg.model.name)
    if model.states_only:
        raise MeshwiseError("--model.name: a bare parameter count cannot be trained; give a model shape")
    check_seq_len(model, cfg.data.seq_len, "--data.seq_len")
    float8.resolve(cfg.layout.precision, "cuda" if torch.cuda.is_available() else "cpu", "--layout.precision")
    if refusal := runtime_refusal(model, cfg.data.seq_len):
        raise MeshwiseError(f"--model.name: {refusal}")
    c = cfg.checkpoint
    files.check_output_dir("--checkpoint.dir", c.dir)
    files.check_output_file("--metrics.file", cfg.metrics.file, parent_must_exist=True)
    if c.resume and c.resume != "auto" and not Path(c.resume).is_dir():
        raise MeshwiseError(f"--checkpoint.resume: {c.resume} does not exist")
    if c.resume == "auto" and not c.dir:
        raise MeshwiseError("--checkpoint.resume auto needs --checkpoint.dir")
    resume_arg = c.resume or ("auto" if c.dir and restart_attempt() > 0 else "")
    if not resume_arg:
        checkpoint.refuse_or_clear(c.dir, c.overwrite, clear=False)
    check_fits_in_memory(model, local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    check_data_path(cfg.data.path)
    corpus = build_corpus(cfg.data, model.vocab)
    check_batch_in_corpus(cfg.schedule.global_batch, corpus)
    if cfg.layout.profile:
        layout_choice.profile_cluster(cfg.layout.profile, 1, 1)
    resume, notes = checkpoint.resolve_resume(resume_arg, c.dir)
    if resume is not None:
        checkpoint.check_shape(checkpoint.read_meta(resume), model, resume)
    if cfg.metrics.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise MeshwiseError(
                "--metrics.tensorboard: the tensorboard package is not installed (pip install 'meshwise[tensorboard]')"
            )
    return Prepared(model, corpus, resume, tuple(notes))


def check_data_path(path: str) -> None:
    """Training data is a regular file or a folder of them: a FIFO would block, /dev/zero never ends."""
    if not path or not Path(path).exists():
        return  # "" is the embedded corpus; a missing path is refused by build_corpus
    p = Path(path)
    if not (p.is_file() or p.is_dir()):
        raise MeshwiseError(f"--data.path: {path} is not a regular file or a folder (a pipe or device?)")
    if not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
        raise MeshwiseError(f"--data.path: {path} is not readable")


def check_fits_in_memory(model: ModelSpec, ranks: int) -> None:
    """Refuse a model whose weights, gradients and AdamW states (16 B/parameter in fp32, before any
    sharding) cannot be allocated on this machine: ``ranks`` processes each build the full model
    once before sharding it (meta construction, then materialised per rank)."""
    if torch.cuda.is_available():
        return
    need_bytes = 16 * model.params * max(1, ranks)
    have_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need_bytes > have_bytes:
        raise MeshwiseError(
            f"--model.name: {model.name} needs about {need_bytes / 1e9:,.1f} GB for weights, "
            f"gradients and AdamW states on {ranks} rank(s); this machine has "
            f"{have_bytes / 1e9:,.1f} GB"
        )


def env_world() -> tuple[int, int, int]:
    """(rank, world size, ranks per node) from torchrun's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


# ------------------------------------------------------------------------------------ helpers
def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def state_bytes(pm: Any) -> int:
    """Bytes of this rank's parameter, gradient and optimizer-state tensors (local shards)."""
    total = 0
    for p in pm.parameters():
        total += _local(p).numel() * p.element_size()
        if p.grad is not None:
            total += _local(p.grad).numel() * p.grad.element_size()
    for st in pm.optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                total += _local(v).numel() * v.element_size()
    return total


def local_peak_bytes(pm: Any, device_type: str, cpu_states_bytes: int = 0) -> int:
    """This rank's peak: the CUDA allocator's, or on CPU its model-state bytes (``cpu_states_bytes``
    once counted: after the first step they no longer change)."""
    if device_type == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return cpu_states_bytes or state_bytes(pm)


def read_step(loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
    """The step's loss and gradient norm as numbers: one copy to the host (it waits for the step)."""
    loss_f, norm_f = torch.stack((loss, grad_norm)).tolist()
    return loss_f, norm_f


def evaluate(pm: Any, corpus: Corpus, global_batch: int, batches: int, rows: range) -> float:
    """Token-mean cross-entropy over ``batches`` held-out global batches (the same for every layout)."""
    return pm.eval_loss(corpus.eval_rows(b, global_batch, rows) for b in range(batches))


@torch.no_grad()
def _poison(pm: Any) -> None:
    """Every weight of this rank becomes NaN (the --inject-nan-at-step test hook)."""
    for p in pm.parameters():
        _local(p).fill_(float("nan"))


def _placement_line(layout: Layout, world: int) -> str:
    """Which node each rank runs on (torchrun's GROUP_RANK), and whether every TP group stays in one."""
    nodes: list[Any] = [None] * world
    dist.all_gather_object(nodes, int(os.environ.get("GROUP_RANK", "0")))
    groups = [nodes[i : i + layout.tp] for i in range(0, world, layout.tp)]
    inside = all(len(set(g)) == 1 for g in groups)
    tp = f"TP groups inside one node: {'yes' if inside else 'NO'}" if layout.tp > 1 else "TP groups: none (tp=1)"
    return f"Placement: node of each rank {nodes}; {tp}"


# --------------------------------------------------------------------------------------- run
def run(cfg: TrainConfig, debug: Debug = Debug(), guard: Any = None, timeout_s: float = 300.0) -> int:
    """The worker's whole run (collective: every rank of the job calls it). ``guard``: the
    :class:`meshwise.launch.guard.Guard` whose stop requests end the run after a saved step."""
    prep = preflight(cfg)
    rank, world, local_world = env_world()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu":
        torch.set_num_threads(layout_choice.threads_per_rank(local_world))
    B, seq = cfg.schedule.global_batch, cfg.data.seq_len
    layout, lines = layout_choice.choose(
        cfg.layout.choice, prep.model, world, local_world, B, seq, device_type, cfg.layout.profile
    )
    torch.manual_seed(cfg.model.seed)
    init_process_group("nccl" if device_type == "cuda" else "gloo", timeout_s)
    mesh = build_mesh(layout, prep.model, B)
    try:
        return _train(cfg, debug, prep, layout, lines, mesh, guard)
    finally:
        end_process_group()


def _agree_after_step(local_peak: int, guard: Any, device_type: str) -> tuple[int, int, float]:
    """One all-reduce (MAX) after each step: the largest rank's memory peak, the signal that asked
    this run to stop and the seconds since the first rank saw it (0 and 0.0 when none did)."""
    signum, age_ms = (guard.signal, int(guard.signal_age_s() * 1000)) if guard is not None else (0, 0)
    t = torch.tensor([local_peak, signum, age_ms], dtype=torch.int64, device="cuda" if device_type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    peak, signum, age_ms = t.tolist()
    return peak, signum, age_ms / 1000


def _exit_now(status: int, message: str) -> None:
    """End this process at once (a checkpoint write is still running in DCP's thread, so no collective
    can be trusted): the one line to the launcher, or on rank 0 to stderr, then ``os._exit``."""
    if not report(status, message) and int(os.environ.get("RANK", "0")) == 0:
        print(f"meshwise: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


def _print_header(log: MetricsLog, cfg: TrainConfig, prep: Prepared, lines: list[str]) -> None:
    """Model, data, the layout's explanation, placement, and what --resume auto passed over."""
    corpus = prep.corpus
    log.print(f"Model: {prep.model.describe()}")
    log.print(
        f"Data: {describe_source(cfg.data.path)}: {corpus.tokens.numel():,} tokens, {corpus.n_train:,} training "
        f"and {corpus.n_eval:,} held-out sequences of {cfg.data.seq_len}"
    )
    for line in lines:
        log.print(line)


def _train(
    cfg: TrainConfig, debug: Debug, prep: Prepared, layout: Layout, lines: list[str], mesh: Any, guard: Any
) -> int:
    rank, world, _ = env_world()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    corpus = prep.corpus
    B, steps = cfg.schedule.global_batch, cfg.schedule.steps
    pm, log, ckpt = _build(cfg, prep, layout, lines, mesh)
    run_state = _start_state(cfg, prep, layout, pm, ckpt, log, rank, world)
    start = int(run_state["step"])
    first_sample = int(run_state["samples"]) - start * B  # so that step k starts at first_sample + k*B
    rows = range(dp_rank(mesh) * pm.replica_rows, (dp_rank(mesh) + 1) * pm.replica_rows)
    nan_step = faults.nan_step(debug.inject_nan_at_step)
    log.begin(start)
    compile_s = _compile(pm, corpus, first_sample + start * B, rows, log) if cfg.layout.compile else None

    mine_bytes = 0  # this rank's peak (on CPU its model-state bytes, counted once after the first step)
    if start == 0 and cfg.schedule.eval_every:
        log.print(f"eval loss at step 0: {evaluate(pm, corpus, B, cfg.schedule.eval_batches, rows):.4f}")
    for step in range(start + 1, steps + 1):
        faults.before_step(step, rank, world)
        if nan_step == step:
            _poison(pm)
        lr = lr_at(step, cfg.schedule, cfg.optimizer)
        for group in pm.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        x, y = corpus.train_rows(first_sample + (step - 1) * B, rows)
        loss, grad_norm = read_step(*pm.step(x, y))  # the step's one host sync, for logging
        step_s = time.perf_counter() - t0
        _check_finite(step, loss, grad_norm, ckpt)
        eval_loss = None
        if cfg.schedule.eval_every and step % cfg.schedule.eval_every == 0 or step == steps:
            eval_loss = evaluate(pm, corpus, B, cfg.schedule.eval_batches, rows)
        mine_bytes = local_peak_bytes(pm, device_type, mine_bytes)
        peak, stop, stop_age_s = _agree_after_step(mine_bytes, guard, device_type)
        log.step(step, loss, grad_norm, lr, step_s, peak, eval_loss, compile_s if step == start + 1 else None)
        state = {"step": step, "samples": first_sample + step * B, "rng": torch.get_rng_state()}
        _save_or_stop(ckpt, log, stop, stop_age_s, state, step == steps, step_s)
    _finish(cfg, ckpt, log, rank)
    return 0


def parallelize_as_configured(cfg: TrainConfig, model: Any, layout: Layout, mesh: Any, device_type: str) -> Any:
    """``model`` parallelized over ``mesh`` with the run's batch, sequence, seed, optimizer, compile
    and precision (``--layout.precision`` resolved for ``device_type``)."""
    return parallelize(
        model,
        layout,
        mesh,
        cfg.schedule.global_batch,
        seq_len=cfg.data.seq_len,
        seed=cfg.model.seed,
        optim=cfg.optimizer,
        compile=cfg.layout.compile,
        precision=float8.resolve(cfg.layout.precision, device_type, "--layout.precision"),
    )


def _build(
    cfg: TrainConfig, prep: Prepared, layout: Layout, lines: list[str], mesh: Any
) -> tuple[Any, MetricsLog, checkpoint.Checkpointer]:
    """The parallelized model, rank 0's metrics log (its header printed) and the checkpointer."""
    rank, world, local_world = env_world()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    model, seq, B, c = prep.model, cfg.data.seq_len, cfg.schedule.global_batch, cfg.checkpoint
    pm = parallelize_as_configured(cfg, model, layout, mesh, device_type)
    lines = [*lines, _placement_line(layout, world), *prep.notes, *(c.line() for c in pm.float8_conversions[:1])]
    peak = layout_choice.peak_flops_per_s(world, local_world, device_type, cfg.layout.profile)
    log = MetricsLog(cfg.metrics, Throughput(model, seq, B, world, peak), cfg.schedule.steps, enabled=rank == 0)
    _print_header(log, cfg, prep, lines)
    meta = {
        "model": checkpoint.model_meta(model),
        "layout": layout.short(),
        "world": world,
        "global_batch": B,
        "seq_len": seq,
        "data": {"path": cfg.data.path, "seed": cfg.data.seed, "tokenizer": cfg.data.tokenizer},
    }
    every, auto = _interval_policy(c, world, local_world)
    ckpt = checkpoint.Checkpointer(
        c.dir,
        every,
        c.keep,
        pm.modules,
        pm.optimizer,
        meta,
        before_commit=lambda s: faults.before_commit(s, rank),
        before_write=lambda s: faults.before_write(s, rank),
        grace_s=c.stop_grace,
        auto=auto,
        say=log.print,
    )
    return pm, log, ckpt


def _check_finite(step: int, loss: float, grad_norm: float, ckpt: checkpoint.Checkpointer) -> None:
    """A non-finite loss or gradient norm stops the run before anything of its state is written."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    last = ckpt.last_saved
    where = f"the last checkpoint is step-{last}" if ckpt.root and last else "no checkpoint was written"
    raise MeshwiseError(
        f"step {step}: non-finite loss {loss} (gradient norm {grad_norm}); stopping without saving this state; {where}"
    )


def _save_or_stop(
    ckpt: checkpoint.Checkpointer,
    log: MetricsLog,
    stop: int,
    stop_age_s: float,
    state: dict[str, Any],
    last: bool,
    step_s: float,
) -> None:
    """After a step (collective): save it if due or if a stop was asked (``stop``: the signal, agreed
    over the ranks; 0 for none), then end the run on a stop (:class:`RunStopped`, or at once when the
    stop save outlives the grace while writing)."""
    step = int(state["step"])
    try:
        saved = ckpt.save(step, last, state, force=bool(stop), stop_age_s=stop_age_s if stop else None, step_s=step_s)
    except checkpoint.OutOfGrace as e:
        log.close()
        line = f"stopped by {signal.Signals(stop).name} after step {step}: {e}"
        if e.in_flight:
            _exit_now(128 + stop, line)
        raise RunStopped(line, 128 + stop) from None
    if saved is not None:
        log.print(f"checkpoint: {saved}")
    if stop and not last:
        log.close()
        name = signal.Signals(stop).name
        kept = (
            f"checkpoint {saved} written; --resume auto continues from it"
            if saved
            else "no checkpoint (--checkpoint.dir is empty)"
        )
        raise RunStopped(f"stopped by {name} after step {step}: {kept}", 128 + stop)


def _interval_policy(c: Any, world: int, local_world: int) -> tuple[int, checkpoint.AutoInterval | None]:
    """(every, auto) for the Checkpointer: a number of steps as given; ``auto`` (and ``default`` on more
    than one node) from the measured saves and the failure rate; ``default`` on one node 50 steps."""
    nodes = max(1, world // max(1, local_world))
    if isinstance(c.every, int):
        return c.every, None
    if c.every == "default" and nodes == 1:
        return DEFAULT_EVERY_STEPS, None
    mtbf_s, why = checkpoint.auto_mtbf(c.failure_rate, c.mtbf_hours, world, nodes)
    return 0, checkpoint.AutoInterval(mtbf_s, why)


def _finish(cfg: TrainConfig, ckpt: checkpoint.Checkpointer, log: MetricsLog, rank: int) -> None:
    """After the last step: under --steps 0 the loaded weights saved as a checkpoint, the metrics
    closed, and a sample from the last checkpoint."""
    c, steps = cfg.checkpoint, cfg.schedule.steps
    if steps == 0 and c.dir:  # --model.from with --steps 0: the loaded weights as a checkpoint
        saved = ckpt.save(0, True, {"step": 0, "samples": 0, "rng": torch.get_rng_state()})
        log.print(f"checkpoint: {saved}")
    log.close()
    dist.barrier()
    if rank == 0 and cfg.generate.prompt and c.dir:
        final = checkpoint.latest(c.dir)
        if final is not None:
            print(f"Sample from {final}:\n{sample_from_checkpoint(final, cfg)}", flush=True)


def _start_state(
    cfg: TrainConfig,
    prep: Prepared,
    layout: Layout,
    pm: Any,
    ckpt: checkpoint.Checkpointer,
    log: MetricsLog,
    rank: int,
    world: int,
) -> dict[str, Any]:
    """Where the run starts: the resumed checkpoint's state (weights and optimizer restored), or step 0
    from the pretrained weights or the seed's, after clearing the checkpoint folders under --overwrite."""
    c = cfg.checkpoint
    run_state: dict[str, Any] = {"step": 0, "samples": 0, "rng": torch.get_rng_state()}
    if prep.resume is not None:
        run_state = ckpt.restore(prep.resume, run_state)
        torch.set_rng_state(run_state["rng"])
        log.print(
            f"Resumed from {prep.resume} (step {run_state['step']}, {run_state['samples']:,} samples seen), "
            f"now under {layout.short()} on {world} rank(s)"
        )
    elif cfg.model.pretrained:
        pretrained.load(pm.modules, prep.model, cfg.model.pretrained)
        log.print(f"Weights: {cfg.model.pretrained} (fine-tuning from step 0 with a fresh optimizer)")
    if prep.resume is None and c.dir and c.overwrite:
        if rank == 0 and checkpoint.own_folders(c.dir):
            log.print(f"Fresh run (--checkpoint.overwrite): removing meshwise's checkpoint folders in {c.dir}")
            checkpoint.refuse_or_clear(c.dir, overwrite=True, clear=True)
        dist.barrier()
    return run_state


def _compile(pm: Any, corpus: Corpus, first: int, rows: range, log: MetricsLog) -> float:
    """Compile before the first timed step (:func:`meshwise.runtime.compile.warm_up` on the rows of
    that step; weights untouched); returns the slowest rank's seconds."""
    x, y = corpus.train_rows(first, rows)
    t = torch.tensor([warm_up(pm, x, y)], dtype=torch.float64, device=mesh_device(pm.mesh))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    seconds = float(t.item())
    log.print(
        f"Compile: torch.compile of each block took {seconds:.1f} s (one forward/backward before the first "
        "step, its gradients dropped); step times exclude it (metrics: compile_s)"
    )
    return seconds


def sample_from_checkpoint(path: str | Path, cfg: TrainConfig) -> str:
    """Build the plain model from a checkpoint's own shape and sample ``cfg.generate``."""
    model, spec = load_plain_model(path)
    g = cfg.generate
    return sample(
        model,
        g.prompt,
        g.tokens,
        g.temperature,
        g.top_k,
        g.seed,
        spec.max_seq,
        tokenizer=cfg.data.tokenizer,
        eos_ids=spec.eos_ids,
    )
