"""Test layout: fast unit tests in ``tests/unit``, and ``integration`` tests in ``tests/integration``
that start worker processes (every test there is marked ``integration`` by its folder).

``bash scripts/test.sh`` runs both; ``bash scripts/test.sh -m "not integration"`` only the fast
ones. The folder alone decides: a test that starts processes, or trains end to end, or traces for
minutes, lives in ``tests/integration``.

Helpers that several test modules share live in ``_models.py``, ``_transport.py``,
``_dist_parity.py``, ``_parity_cases.py``, ``_tokenizer.py``, ``_torchtitan.py`` and ``_cli.py``
beside this file, never in another ``test_*.py``; so do worker modules a test launches by name (``_pair_bench.py``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The shared helpers (_models.py, _cli.py, ...) sit beside this file, above both test folders.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "integration":
            item.add_marker(pytest.mark.integration)


# The parity suite's launches (one per world size, every layout of it in turn) and the fault tests:
# one unit of work, about half the launches' time. Worker seconds under ``pytest -n 2`` on the 2-core
# host, each unit beside the other: parity 196, measure 241, float8 parity 52, faults 131 (620 in
# all); the rest 634; the unit tests 317, shared by both workers.
PARITY_SUITE = ("test_parity.py", "test_measure.py", "test_fp8_parity.py", "test_faults.py")


def work_unit(nodeid: str) -> str:
    """xdist's unit of work for a test (node ids are relative to the repository root): the
    integration tests are two units, the parity suite's launches and the rest, each run in order on
    one worker, as each test already starts several processes (about 10 minutes each on 2 cores); a
    unit test is a unit of its own, shared among the workers."""
    path, _, _ = nodeid.partition("::")
    folder, _, module = path.rpartition("/")
    if not folder.endswith("tests/integration"):
        return nodeid
    return "integration: parity suite" if module in PARITY_SUITE else "integration: the rest"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``pytest -n N`` (scripts/test.sh), the tests go to the workers by :func:`work_unit`
    (xdist's ``--dist loadgroup`` would group by markers, but its group suffix is lost with pytest
    9.2's node ids). The largest units start first, one per worker."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """No test calibrates this machine: the profile cache (measure/auto_profile.py) points at a
    temporary folder holding the catalog's ``cpu`` values under this machine's keys, so a run
    without a profile predicts as it did with the catalog (and subprocesses inherit it)."""
    from meshwise.catalog import read_catalog
    from meshwise.measure import auto_profile
    from meshwise.measure.calibrate import format_toml

    folder = tempfile.mkdtemp(prefix="meshwise-test-cache-")
    os.environ[auto_profile.CACHE_ENV] = folder
    os.environ.pop(auto_profile.PROFILE_ENV, None)
    table = {"name": "cpu", **read_catalog("accelerators.toml")["cpu"]}
    for nproc in range(1, 9):
        auto_profile.cache_path(nproc).write_text(format_toml(table))
    config._meshwise_cache = folder  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_meshwise_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
