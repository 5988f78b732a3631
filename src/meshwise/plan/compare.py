"""Several layouts side by side (``plan --layout A --layout B`` or ``--layout "A;B"``): each evaluated
even if it does not fit, ranked best first (fitting ones by tokens/s, then the rest by memory), with
what binds each one."""

from __future__ import annotations

from meshwise.cost.estimate import Estimate
from meshwise.errors import MeshwiseError

BINDING_SHARE = 0.10  # a part of the step this large or larger is named as what binds the layout


def split_layouts(values: list[str] | None) -> list[str]:
    """Every ``--layout`` value, each split at ``;``; a layout given twice is refused, never dropped."""
    texts = [t.strip() for v in values or [] for t in v.split(";") if t.strip()]
    if values and not texts:
        raise MeshwiseError("--layout: empty; give key=value pairs, e.g. dp=8,zero=3,tp=2")
    return texts


def check_distinct(layouts: list) -> None:
    seen: dict = {}
    for lay in layouts:
        if lay in seen:
            raise MeshwiseError(f"--layout: {lay.short()} is given twice; each layout is evaluated once")
        seen[lay] = True


def rank(estimates: list[Estimate]) -> list[Estimate]:
    """Fitting layouts first, fastest first; then those that do not fit, smallest first."""
    return sorted(estimates, key=lambda e: (not e.fits, -e.tokens_per_s if e.fits else e.memory.total))


PART_WORDS = {
    "comm": "exposed communication",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "compute": "compute",
}  # the parts of a step, as the binds column and the explanation name them


def _parts(e: Estimate) -> dict[str, float]:
    t = e.time
    return {"compute": t.compute_s, "comm": t.comm_exposed_s, "bubble": t.bubble_s, "optimizer": t.optimizer_s}


def binding(e: Estimate) -> str:
    """What binds a layout, the one rule behind the table's binds column and the explanation's words:
    memory when it does not fit, else the largest non-compute share of the step (exposed
    communication, pipeline bubble, optimizer step) when at least BINDING_SHARE, else compute."""
    if not e.fits:
        return "memory"
    parts = _parts(e)
    del parts["compute"]
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    share = seconds / e.time.step_s if e.time.step_s else 0.0
    return f"{name} {share:.0%}" if share >= BINDING_SHARE else "compute"


def costlier_part(w: Estimate, r: Estimate) -> tuple[str, float]:
    """The part of ``r``'s step that exceeds ``w``'s most, in :data:`PART_WORDS`, and by how many seconds:
    why ``r`` is slower (a difference, not what binds ``r``: :func:`binding` says that)."""
    mine, theirs = _parts(w), _parts(r)
    name = max(theirs, key=lambda k: theirs[k] - mine[k])
    return PART_WORDS[name], theirs[name] - mine[name]
