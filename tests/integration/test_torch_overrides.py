"""Every replacement meshwise makes of a torch function is called during a traced step, and every
FSDP2 and tracker attribute meshwise reads exists after it (runtime/_torch_private.OVERRIDE_CALLS,
FSDP_NAMES, FSDP_LAZY_NAMES; measure/_torch_tools.TRACKER_NAMES, MOD_TRACKER_NAMES). The traced
step is ``meshwise verify``'s (one process, torch's fake process group): the tiny model under pp=2,
dp=2 (ZeRO-3), tp=2 on 8 fake ranks, inside ``timed_waits`` as ``meshwise measure`` times its steps,
then one wait on a gloo collective (the fake backend's works are not waited through ``Work.wait``;
gloo's, as ``measure`` runs, are). It runs in a spawned process with a gloo group.
"""

from __future__ import annotations

import multiprocessing

import pytest

torch = pytest.importorskip("torch")

from meshwise.measure import _torch_tools  # noqa: E402
from meshwise.runtime import _torch_private  # noqa: E402

LAYOUT = "pp=2,dp=2,zero=3,tp=2"
# every replacement of a torch function (runtime/_torch_private.OVERRIDE_CALLS' keys)
OVERRIDES = (
    "Work.wait",
    "wait_tensor",
    "_wait_batch_p2p",
    "_PipelineSchedule._warmup_p2p",
    "MemTracker._update_peak_stats",
    "MemTracker._pre_fw_hook",
    "ModTracker._fw_pre_hook",
    "ShardingPropagator._propagate_tensor_meta_non_cached",
)


def _gloo_wait() -> None:
    """One asynchronous all-reduce on a one-rank gloo group, waited on as FSDP2 and the schedules do."""
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(4), async_op=True).wait()
        finally:
            dist.destroy_process_group()


def _traced_step() -> dict:
    """In a fresh process: one traced step of LAYOUT's rank 0 inside timed_waits; the calls of each
    replacement, and the FSDP2 and tracker attributes meshwise reads that are missing after it."""
    from meshwise.layout import parse
    from meshwise.measure import verify_worker
    from meshwise.measure.rank_trace import RankTrace
    from meshwise.spec import load_model

    seen: dict[str, object] = {}
    held_by, tracker_for = verify_worker._held_by, verify_worker.tracker_for

    def keep_model(pm):
        seen["pm"] = pm
        return held_by(pm)

    def keep_tracker(*args, **kwargs):
        seen["tracker"] = tracker_for(*args, **kwargs)
        return seen["tracker"]

    verify_worker._held_by, verify_worker.tracker_for = keep_model, keep_tracker
    _torch_private.OVERRIDE_CALLS.clear()
    waits: list[str] = []
    with _torch_private.timed_waits(lambda kind, seconds: waits.append(kind)):
        verify_worker.trace_rank(RankTrace(load_model("tiny"), parse(LAYOUT, 8), 0, 4, 64, "cpu"), "cpu")
        _gloo_wait()  # the fake backend's works are not waited through Work.wait; gloo's (measure's) are
    missing = []
    groups = _torch_private.fsdp_param_groups(seen["pm"].modules)
    states = [m._get_fsdp_state() for c in seen["pm"].modules for m in c.modules() if hasattr(m, "_get_fsdp_state")]
    holders = {
        "FSDPState": states,
        "FSDPParamGroup": groups,
        "FSDPCommContext": [g.comm_ctx for g in groups],
        "FSDPParam": [fp for g in groups for fp in g.fsdp_params],
    }
    for names in (_torch_private.FSDP_NAMES, _torch_private.FSDP_LAZY_NAMES):
        for kind, attrs in names.items():
            assert holders[kind], kind
            missing += [f"{kind}.{a}" for a in attrs for obj in holders[kind][:1] if not hasattr(obj, a)]
    tracker = seen["tracker"]
    missing += [f"MemTracker.{a}" for a in _torch_tools.TRACKER_NAMES if not hasattr(tracker, a)]
    missing += [f"ModTracker.{a}" for a in _torch_tools.MOD_TRACKER_NAMES if not hasattr(tracker._mod_tracker, a)]
    return {"calls": dict(_torch_private.OVERRIDE_CALLS), "missing": missing, "waits": sorted(set(waits))}


@pytest.fixture(scope="module")
def traced() -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_traced_step)


def test_every_override_runs_in_a_traced_step(traced) -> None:
    print(traced["calls"])
    assert {name: traced["calls"].get(name, 0) for name in OVERRIDES if not traced["calls"].get(name)} == {}
    assert set(traced["calls"]) <= set(OVERRIDES)  # no replacement goes unchecked
    # the waits timed as communication (a pipeline's as idle: tests/integration/test_measure.py)
    assert "comm" in traced["waits"]


def test_every_fsdp_and_tracker_attribute_read_exists_after_a_step(traced) -> None:
    assert traced["missing"] == []
