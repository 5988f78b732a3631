"""Parity of float8 training (``--precision fp8``, torchao tensorwise): layouts against one process.

Each layout trains the tiny model 6 AdamW steps in fp8 (FSDP2's float8 all-gather, torchao's
float8 TP styles) and is compared with one process training the same model with the same float8
linears (``_dist_parity.reference(precision=...)``), run as the layout's micro-batches: float8's
dynamic scales are taken per GEMM call, so a reference on the whole batch at once quantises
differently (measured: 7.7e-4 relative loss at step 5 under dp=2,zero=3, against 2.7e-5 with
matched micro-batches).

Checked: every step's loss within 1e-3 relative (the acceptance bound), the first
loss within 1e-6, the first gradient norm within 1e-4 (the same weights and quantisation give the
same numbers up to summation order) and the second within 3e-4 (after one AdamW step, whose
normalised update turns summation-order differences in small gradients into weight differences:
dp=2,tp=2,sp=on read 1.03e-4 on an AMD EPYC host without AVX-512, 2026-12-06, under 1e-4 on the
hosts before), and the eval loss after the last step within 1e-3. A run
that silently trained in fp32 fails the first-step checks (:func:`test_checks_tell_fp8_from_fp32`),
and a replica fed the wrong rows fails them too.

``fp8-rowwise`` is checked the same way under dp=2,zero=3. On CPU the float8 GEMMs are torchao's
emulation, as the runtime runs them there (``meshwise.runtime.float8``; torch's CPU ``_scaled_mm``
gives the same numbers, ``tests/unit/test_float8.py``, at about 100x the time).
"""

from __future__ import annotations

import pytest

import _dist_parity as dp
from _dist_parity import Case

pytest.importorskip("torchao")

STEPS = 6
LOSS_RTOL = 1e-3  # relative loss, 6 steps
FIRST_LOSS_RTOL = 1e-6
NORM_RTOLS = (1e-4, 3e-4)  # the first two steps' gradient norms
# Under TP the float8 casts see each rank's shard and its GEMMs sum in another order: on an AMX-capable
# Xeon host the first two gradient norms of tp=2 read 1.7e-4 and 1.8e-3 from one process's (the same at
# 1732076 as now, so the host, not a change), while the losses stay within LOSS_RTOL and the first loss
# within FIRST_LOSS_RTOL, which still tell a wrong layout apart (test_wrong_rows_are_caught,
# test_checks_tell_fp8_from_fp32).
NORM_RTOLS_TP = (3e-4, 3e-3)
CASES = {
    2: [
        Case("dp=2,zero=3", precision="fp8", steps=STEPS),
        Case("tp=2,sp=off,mbs=4", precision="fp8", steps=STEPS),
        Case("pp=2,schedule=1f1b", precision="fp8", steps=STEPS),
        Case("dp=2,zero=3", precision="fp8-rowwise", steps=STEPS),
        Case("dp=2,zero=3", precision="fp8", steps=2, corrupt="same-data"),
    ],
    4: [Case("dp=2,tp=2,sp=on,mbs=2", precision="fp8", steps=STEPS)],
}
GROUP_TIMEOUT_S = 300  # hang guard, not a timing assertion

_groups: dict[int, dp.GroupResult] = {}
_references: dict[tuple, dp.Run] = {}


def _reference(precision: str, tp: int, mbs: int) -> dp.Run:
    key = (precision, tp, mbs)
    if key not in _references:
        _references[key] = dp.reference(precision=precision, steps=STEPS, tp=tp, micro_rows=mbs)
    return _references[key]


def _result(world: int, case: Case) -> dp.Run:
    if world not in _groups:
        _groups[world] = dp.run_group(world, CASES[world], GROUP_TIMEOUT_S)
    g = _groups[world]
    if case.name not in g.runs:
        pytest.fail(f"no result for {case.name} (world {world}): {g.error or 'worker group ended early'}")
    return g.runs[case.name]


def _problems(run: dp.Run, ref: dp.Run, norm_rtols: tuple[float, float] = NORM_RTOLS) -> list[str]:
    """What differs; a run of fewer steps than ``ref`` is compared on its steps (no eval loss)."""
    problems = []
    for i, (got, want) in enumerate(zip(run.losses, ref.losses[: len(run.losses)], strict=True)):
        tol = FIRST_LOSS_RTOL if i == 0 else LOSS_RTOL
        if abs(got - want) > tol * abs(want):
            problems.append(f"step {i}: loss {got:.9g} vs {want:.9g} (rel {abs(got - want) / want:.1e} > {tol:g})")
    for i, (got, want, tol) in enumerate(zip(run.grad_norms, ref.grad_norms, norm_rtols)):
        if abs(got - want) > tol * abs(want):
            problems.append(f"step {i}: gradient norm {got:.9g} vs {want:.9g}")
    if len(run.losses) == len(ref.losses) and abs(run.eval_loss - ref.eval_loss) > LOSS_RTOL * abs(ref.eval_loss):
        problems.append(f"eval loss {run.eval_loss:.9g} vs {ref.eval_loss:.9g}")
    return problems


def _reference_for(world: int, case: Case) -> dp.Run:
    from meshwise.layout import parse

    layout = parse(case.layout, world)
    return _reference(case.precision, layout.tp, layout.mbs)


GOOD = [(w, c) for w, cases in CASES.items() for c in cases if not c.corrupt]


@pytest.mark.parametrize("world,case", GOOD, ids=[f"{w}:{c.name}" for w, c in GOOD])
def test_fp8_layout_matches_one_process_fp8(world: int, case: Case) -> None:
    from meshwise.layout import parse

    run, ref = _result(world, case), _reference_for(world, case)
    problems = _problems(run, ref, NORM_RTOLS_TP if parse(case.layout, world).tp > 1 else NORM_RTOLS)
    assert not problems, f"{case.name} differs from one-process {case.precision}:\n" + "\n".join(problems)
    worst = max(abs(a - b) / b for a, b in zip(run.losses, ref.losses))
    print(f"{world}:{case.name}: max relative loss difference over {STEPS} steps {worst:.1e}")


def test_wrong_rows_are_caught() -> None:
    (case,) = [c for c in CASES[2] if c.corrupt]
    assert _problems(_result(2, case), _reference_for(2, case))


def test_checks_tell_fp8_from_fp32() -> None:
    """The same comparison between one-process fp32 and one-process fp8 fails: a layout that ran in
    fp32 while the reference quantised would not pass."""
    fp32 = dp.reference(steps=STEPS, micro_rows=4)
    assert _problems(fp32, _reference("fp8", 1, 4))
