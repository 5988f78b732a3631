"""The package people install: meshwise's wheel, built from this tree, installed in a clean venv that
has no torch, plans; ``meshwise train`` there refuses in one line, naming ``meshwise[train]``.

No network: the wheel is built with ``pip wheel --no-deps --no-build-isolation`` from a copy of the
tree, and its one dependency, rich (with what rich requires), is packed into wheels from the
distributions installed beside these tests; pip then installs with ``--no-index`` from that folder
alone, with every pip setting from the environment and config files switched off. A wheel that
required torch would fail to install here (the folder holds no torch).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from meshwise import __version__

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without pip's settings (PIP_FIND_LINKS may name a folder holding torch) and
    without PYTHONPATH (which would import meshwise from src/ instead of the installed wheel)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _requirements(name: str) -> list[str]:
    """The distributions ``name`` needs on this platform, without extras (names as pip spells them)."""
    out = []
    for req in importlib.metadata.requires(name) or []:
        if ";" in req and "extra" in req.split(";", 1)[1]:
            continue
        out.append(re.match(r"[A-Za-z0-9_.-]+", req)[0])
    return out


def _pack_installed(name: str, folder: Path) -> None:
    """Write the installed pure-Python distribution ``name`` as a wheel in ``folder`` (its files as
    its RECORD lists them, byte-compiled files and scripts left out; a fresh RECORD)."""
    dist = importlib.metadata.distribution(name)
    assert "Root-Is-Purelib: true" in (dist.read_text("WHEEL") or ""), f"{name} is not pure Python"
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f)]
    info = next(str(f).split("/")[0] for f in files if str(f).endswith(".dist-info/METADATA"))
    rows, wheel = [], folder / f"{info.removesuffix('.dist-info')}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in files:
            if str(f) in (f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/REQUESTED", f"{info}/direct_url.json"):
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            zf.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((str(f), f"sha256={digest}", str(len(data))))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*rows, (f"{info}/RECORD", "", "")])
        zf.writestr(f"{info}/RECORD", record.getvalue())


def _build_wheels(folder: Path, tmp: Path) -> Path:
    """meshwise's wheel (from a copy of the tree: the build leaves no egg-info in it) and rich's."""
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(folder), str(tree)],
        check=True,
        env=_clean_env(),
    )
    todo, seen = ["rich"], set()
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        _pack_installed(name, folder)
        todo += _requirements(name)
    return next(folder.glob("meshwise-*.whl"))


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("package")
    wheels = tmp / "wheels"
    wheels.mkdir()
    wheel = _build_wheels(wheels, tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_clean_env())
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), str(wheel)],
        check=True,
        env=_clean_env(),
    )
    return venv


def _meshwise(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin/meshwise"), *args], capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=venv
    )


def test_the_wheel_installs_without_torch_and_plans(clean_venv: Path) -> None:
    no_torch = subprocess.run(
        [str(clean_venv / "bin/python"), "-c", "import torch"], capture_output=True, env=_clean_env()
    )
    assert no_torch.returncode != 0  # the clean venv really has no torch
    plan = _meshwise(clean_venv, "plan", "--model", "llama3-8b", "--gpus", "8", "--json")
    assert plan.returncode == 0, plan.stderr
    assert '"status"' in plan.stdout and "dp=" in plan.stdout
    version = _meshwise(clean_venv, "--version")
    assert version.returncode == 0 and version.stdout == f"meshwise {__version__}\n"


@pytest.mark.parametrize(
    "command", [["train"], ["measure", "--layout", "dp=2"], ["verify", "--layout", "dp=8"], ["calibrate"]]
)
def test_the_runtime_commands_refuse_in_one_line_without_torch(clean_venv: Path, command: list[str]) -> None:
    run = _meshwise(clean_venv, *command)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "pip install 'meshwise[train]'" in run.stderr and run.stderr.startswith(f"meshwise: error: {command[0]}:")
