"""Deliberate faults, for the fault-tolerance tests (hidden from the help; never set in real runs).

``MESHWISE_FAULTS`` is a comma-separated list, one item per torchrun attempt
(``TORCHELASTIC_RESTART_COUNT`` picks the item; ``-`` means no fault in that attempt):

- ``kill@N``: the last rank SIGKILLs itself just before step N;
- ``save@N``: rank 0 SIGKILLs itself during the save of step N, after DCP wrote the shards and
  before the commit;
- ``term@N``: rank 0 sends SIGTERM, just before step N, to meshwise's launcher (its parent) when
  there is one, else to itself: a preemption at a known point;
- ``term2@N``: as ``term@N``, then a second SIGTERM to the same process 1.5 s later;
- ``slowsave@N``: rank 0's checkpoint writer stalls ``SLOW_WRITE_S`` before writing the shards of
  step N's save (a slow or shared file system), in DCP's writing thread;
- ``term+slowsave@N``: both, at step N: a preemption whose save outlasts a short grace.

``--inject-nan-at-step N`` (or ``MESHWISE_INJECT_NAN_AT_STEP``) fills every weight with NaN before
step N, so the loss really becomes non-finite.
"""

from __future__ import annotations

import os
import signal
import time


def _my_fault() -> tuple[str, int] | None:
    items = [s.strip() for s in os.environ.get("MESHWISE_FAULTS", "").split(",") if s.strip()]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt >= len(items) or items[attempt] == "-":
        return None
    kind, _, step = items[attempt].partition("@")
    return kind, int(step)


SLOW_WRITE_S = 60.0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def before_step(step: int, rank: int, world: int) -> None:
    fault = _my_fault()
    if fault == ("kill", step) and rank == world - 1:
        _die()
    if fault in (("term", step), ("term2", step), ("term+slowsave", step)) and rank == 0:
        launched = os.environ.get("MESHWISE_LAUNCHER") == "1"
        target = os.getppid() if launched else os.getpid()
        os.kill(target, signal.SIGTERM)
        if fault[0] == "term2":
            time.sleep(1.5)
            os.kill(target, signal.SIGTERM)
        if fault[0] == "term+slowsave":
            time.sleep(1.0)  # the forwarded signal reaches every worker before this step ends: the stop is at N


def before_write(step: int, rank: int) -> None:
    if _my_fault() in (("slowsave", step), ("term+slowsave", step)) and rank == 0:
        time.sleep(SLOW_WRITE_S)


def before_commit(step: int, rank: int) -> None:
    if _my_fault() == ("save", step) and rank == 0:
        _die()


def nan_step(flag: int | None) -> int | None:
    if flag is not None:
        return flag
    env = os.environ.get("MESHWISE_INJECT_NAN_AT_STEP")
    return int(env) if env else None
