"""Test layout: fast unit tests in ``tests/unit``, and ``integration`` tests in ``tests/integration``
that start worker processes (every test there is marked ``integration`` by its folder).

``bash scripts/test.sh`` runs both; ``bash scripts/test.sh -m "not integration"`` only the fast
ones. A few single tests in ``tests/unit`` still start workers: they are marked by name below or
with ``@pytest.mark.integration`` in their file.

Helpers that several test modules share live in ``_models.py``, ``_transport.py``,
``_dist_parity.py`` and ``_cli.py`` beside this file, never in another ``test_*.py``.
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
# Single tests elsewhere that start workers, or train, export and generate end to end (some in this process:
# tests/_cli.py).
INTEGRATION_TESTS = {
    "test_calibrate.py::test_a_tiny_calibration_writes_a_plannable_profile",
    "test_train.py::test_non_finite_loss_stops_before_saving_that_state",
    "test_train.py::test_export_and_generate",
    "test_tokenizer.py::test_train_generate_export_with_a_tokenizer",
    # one process, but minutes of tracing (meshwise verify at 64 ranks): run with the heavy ones
    "test_verify.py::test_70b_collectives_are_exact_and_memory_close",
    "test_verify.py::test_the_gpu_precision_path_ran",
    "test_verify.py::test_reduced_depth_matches_full_depth_on_a_small_model",
    # compiles the fake CUDA device (g++, seconds) and starts Python twice
    "test_fake_cuda.py::test_a_backward_runs_on_fake_cuda_tensors",
    "test_fake_cuda.py::test_without_the_library_the_cpu_build_cannot",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name
        if item.path.parent.name == "integration" or f"{module}::{item.originalname}" in INTEGRATION_TESTS:
            item.add_marker(pytest.mark.integration)


def pytest_configure(config: pytest.Config) -> None:
    """No test calibrates this machine: the profile cache (measure/auto_profile.py) points at a
    temporary folder holding the catalog's ``cpu`` values under this machine's keys, so a run
    without a profile predicts as it did with the catalog (and subprocesses inherit it)."""
    from meshwise.measure import auto_profile
    from meshwise.measure.calibrate import format_toml
    from meshwise.catalog import read_catalog

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
