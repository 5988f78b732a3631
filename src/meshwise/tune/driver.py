"""Rank 0 of a tune: the base profile, the field, the results file, and what the tune leaves behind.

The base profile is ``--layout.profile`` where given; on CPU else this machine's calibration (as
``train`` reads it: measure/auto_profile.py), or the catalog's ``cpu``; on CUDA the catalog entry
of the GPU's name with the memory the device reports (train/layout_choice.py's names).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshwise.catalog import read_catalog
from meshwise.files import read_toml, write_atomically
from meshwise.layout import parse
from meshwise.measure import auto_profile
from meshwise.spec import TrainSpec
from meshwise.train import config as config_mod
from meshwise.train.layout_choice import _GPU_NAMES, threads_per_rank
from meshwise.tune.field import plan_pool_and_pick, relative_band
from meshwise.tune.refit import Predictor, profile_text
from meshwise.tune.trials import (
    RUNOFF,
    TIMED_STEPS,
    WARMUP_STEPS,
    Trial,
    best_trial,
    noise_of,
    read_results,
    steps_used,
    write_results,
)
from meshwise.tune.tuner import Tune

RESULTS, PROFILE, CONFIG = "trials.jsonl", "profile.toml", "train.toml"


def base_profile(cfg: Any, local_world: int, device_type: str) -> tuple[dict[str, Any], str]:
    """(the profile table the tune starts from, where it came from)."""
    if cfg.layout.profile:
        table = read_toml(Path(cfg.layout.profile), "--layout.profile")
        return dict(table.get("accelerator", table)), cfg.layout.profile
    if device_type != "cuda":
        found = auto_profile.resolved(local_world)
        if found:
            table = read_toml(Path(found), "--layout.profile")
            return dict(table.get("accelerator", table)), found
        return {"name": "cpu", **read_catalog("accelerators.toml")["cpu"]}, "catalog cpu"
    import torch  # torch: only on a GPU; the driver plans in pure Python (test_tune_command)

    name = torch.cuda.get_device_name()
    key = next((p for k, p in _GPU_NAMES if k in name), "h100")
    memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    key = ("a100-80gb" if memory > 50e9 else "a100-40gb") if key == "a100" else key
    return {"name": key, **read_catalog("accelerators.toml")[key], "memory_bytes": int(memory)}, f"catalog {key}"


class Driver:
    """Chooses each trial, records it, and at the end writes the profile and the train config."""

    def __init__(
        self, cfg: Any, opts: dict[str, Any], model: Any, world: int, local_world: int, device_type: str
    ) -> None:
        self.cfg, self.opts, self.world, self.device_type = cfg, opts, world, device_type
        self.out = Path(opts.get("out", "runs/tune"))
        self.out.mkdir(parents=True, exist_ok=True)
        table, self.source = base_profile(cfg, local_world, device_type)
        precision = "fp32" if device_type != "cuda" else "bf16-mixed"
        train = TrainSpec(global_batch=cfg.schedule.global_batch, seq_len=cfg.data.seq_len, precision=precision)
        threads = threads_per_rank(local_world) if device_type != "cuda" else 1
        predictor = Predictor(model, train, world, local_world, threads)
        cluster = predictor.cluster(table)
        pool, self.auto = plan_pool_and_pick(model, cluster, train, cfg.data.seq_len)
        self.inputs = {
            "model": cfg.model.name,
            "pretrained": cfg.model.pretrained,
            "global_batch": train.global_batch,
            "seq_len": train.seq_len,
            "world": world,
            "local_world": local_world,
            "profile": self.source,
            "precision": cfg.layout.precision,
        }
        trials = read_results(self.out / RESULTS, self.inputs) if opts.get("resume") else []
        self.resumed = len(trials)
        self.tune = Tune(
            pool,
            table,
            predictor,
            relative_band(model, cluster, train),
            opts.get("trials"),
            trials,
            exhaustive=opts.get("exhaustive") or 0,
            warmup=opts.get("trial_warmup") or WARMUP_STEPS,
            timed=opts.get("trial_steps") or TIMED_STEPS,
        )
        budget = opts.get("budget_minutes")
        self.deadline = time.monotonic() + budget * 60 if budget else None

    def next(self) -> tuple[Any, float, int, float | None, float, int] | None:
        """(layout, predicted step, round, best measured step, noise, most timed steps) of the next
        trial, or None."""
        out_of_time = self.deadline is not None and time.monotonic() > self.deadline
        found = self.tune.next(out_of_time)
        if found is None:
            return None
        candidate, rnd = found
        best = None if self.tune.exhaustive else best_trial(self.tune.trials)  # exhaustive: no early stop
        return (
            candidate.layout,
            candidate.predicted_step_s,
            rnd,
            best.measured_step_s if best else None,
            noise_of(best.steps_s) if best else 0.0,
            self.tune.max_timed_steps(),
        )

    def runoff(self) -> list[tuple[Any, float, int, float | None, float, int]] | None:
        """The run-off's trials, as :meth:`next` gives one (the predicted step: the refitted
        profile's; the most timed steps: the passes the budget leaves), or None when there is none."""
        out_of_time = self.deadline is not None and time.monotonic() > self.deadline
        contenders = self.tune.runoff(out_of_time)
        if not contenders:
            return None
        best_s, passes = contenders[0].measured_step_s, self.tune.runoff_passes(len(contenders))
        return [(parse(t.layout), self.tune.predicted(t.layout), t.round, best_s, 0.0, passes) for t in contenders]

    def record(self, trial: Trial) -> None:
        write_results(self.out / RESULTS, self.inputs, [*self.tune.trials, trial])
        self.tune.record(trial)

    def record_runoff(self, trials: list[Trial]) -> None:
        write_results(self.out / RESULTS, self.inputs, [*self.tune.trials, *trials])
        for trial in trials:
            self.tune.record(trial)

    def finish(self) -> dict[str, Any]:
        """Write the refitted profile and, with a pick, the train config; returns the summary."""
        tune = self.tune
        profile = self.out / PROFILE
        table = {**tune.table, "source": f"meshwise tune: {self.source} refitted to {len(tune.trials)} trial(s)"}
        write_atomically(profile, profile_text(table))
        best = best_trial(tune.trials)
        summary: dict[str, Any] = {
            "field": tune.field,
            "dropped": tune.dropped,
            "resumed": self.resumed,
            "profile": str(profile),
            "base_profile": self.source,
            "factors": tune.factors,
            "band": tune.band,
            "error_before": tune.errors(tune.base_table),
            "error_after": tune.errors(tune.table),
            "refitted_step_s": {t.layout: tune.predicted(t.layout) for t in tune.trials},
            "trials_used": tune.trials_used,
            "trials_allowed": tune.max_trials,
            "steps_used": tune.steps_used,
            "step_budget": tune.budget_steps,
            "runoff_steps": steps_used([t for t in tune.trials if t.status == RUNOFF], tune.warmup),
            "pick": best.layout if best else None,
            "auto": self.auto,
            "config": None,
        }
        if best is not None:
            cfg = replace(self.cfg, layout=replace(self.cfg.layout, choice=best.layout, profile=str(profile)))
            write_atomically(self.out / CONFIG, config_mod.to_toml(cfg))
            summary["config"] = str(self.out / CONFIG)
        return summary
