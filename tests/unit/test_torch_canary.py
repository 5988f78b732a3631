"""The canary for torch's private names: every private torch name meshwise reads or patches exists
in the installed torch, and a name renamed in a sandbox fails the check. That every replacement
meshwise makes of a torch function is called during a traced step is checked in
tests/integration/test_torch_overrides.py (it starts a process).

The names are the modules' own lists (runtime/_torch_private.PRIVATE_NAMES, FSDP_NAMES,
FSDP_LAZY_NAMES; measure/_torch_tools.PRIVATE_NAMES, TRACKER_NAMES), so a new private use is
added there and checked here.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from meshwise.launch import torch_release  # noqa: E402
from meshwise.measure import _torch_tools  # noqa: E402
from meshwise.runtime import _torch_private  # noqa: E402


def _resolve(module: str, path: str) -> object:
    """``module``'s attribute ``path`` (dotted); ``module`` may be an attribute chain from torch."""
    try:
        obj = importlib.import_module(module)
    except ImportError:
        obj = importlib.import_module(module.split(".")[0])
        for part in module.split(".")[1:]:
            obj = getattr(obj, part)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def missing_private_names() -> list[str]:
    """The listed private names this torch lacks (the canary: empty on a torch meshwise runs on)."""
    missing = []
    for module, path in (*_torch_private.PRIVATE_NAMES, *_torch_tools.PRIVATE_NAMES):
        try:
            _resolve(module, path)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path}")
    return missing


def test_every_private_name_exists() -> None:
    assert missing_private_names() == []


@pytest.mark.parametrize(
    "module,name",
    [
        ("torch.distributed.pipelining.schedules", "_wait_batch_p2p"),
        ("torch.distributed._tools.mem_tracker", "MemTracker._update_peak_stats"),
    ],
)
def test_a_renamed_name_fails_the_canary(monkeypatch, module: str, name: str) -> None:
    owner, _, attr = f"{module}.{name}".rpartition(".")
    holder = _resolve(module, name.rpartition(".")[0]) if "." in name else importlib.import_module(module)
    monkeypatch.delattr(holder, attr)  # as if torch had renamed it
    assert missing_private_names() == [f"{owner}.{attr}"]


def test_the_torch_range_is_what_the_suite_ran_on() -> None:
    """pyproject's train extra admits the minor release the suite has run on, and only it; the
    warning fires for any other. The planning install itself needs no torch."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("torch") for d in project["dependencies"])
    torch_dep = next(d for d in project["optional-dependencies"]["train"] if d.startswith("torch"))
    major, minor = (int(x) for x in torch_release.TESTED_TORCH.split("."))
    assert torch_dep == f"torch>={major}.{minor},<{major}.{minor + 1}"
    assert not torch_release.warn_untested_torch(f"{major}.{minor}.0+cpu")
    assert torch.__version__.startswith(torch_release.TESTED_TORCH + ".")


def test_an_untested_torch_gets_one_line(capsys) -> None:
    assert torch_release.warn_untested_torch("2.14.1")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch 2.14.1 is untested" in err


@pytest.mark.parametrize("command", ["train", "measure", "verify"])
def test_the_commands_that_import_torch_warn_at_start_up(monkeypatch, capsys, command: str) -> None:
    """An untested torch: one line before the command's own work (here refused at once: bad input)."""
    from importlib import metadata

    from meshwise.cli import main

    monkeypatch.setattr(metadata, "version", lambda name: "2.99.0")
    bad = {
        "train": ["train", "--steps", "-1"],
        "measure": ["measure", "--layout", "tp=3"],
        "verify": ["verify", "--layout", "tp=3"],
    }[command]
    main(bad)
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("meshwise: warning: torch 2.99.0 is untested")


def test_plan_does_not_warn(monkeypatch, capsys) -> None:
    from importlib import metadata

    from meshwise.cli import main

    monkeypatch.setattr(metadata, "version", lambda name: "2.99.0")
    assert main(["plan", "--gpus", "8", "--model", "llama3-8b", "--top", "1", "--json"]) == 0
    assert "warning: torch" not in capsys.readouterr().err


def test_split_backward_gives_the_plain_backward_s_gradients() -> None:
    """runtime._torch_private.split_backward (the zero-bubble schedules' two passes, which
    ``meshwise calibrate`` times): the same input and weight gradients as one backward."""
    from meshwise.runtime._torch_private import split_backward
    from meshwise.runtime.model import build_model
    from meshwise.spec import load_model

    model = load_model("tiny")
    stage = build_model(model, seed=0).keep_only(0, model.layers, first=False, last=False)
    params = list(stage.parameters())
    x0 = torch.randn(2, 8, model.hidden, generator=torch.Generator().manual_seed(0))
    grads = []
    for split in (False, True):
        stage.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out = stage(x)
        if split:
            split_backward(out, torch.ones_like(out), [x], params)
        else:
            out.backward(torch.ones_like(out))
        grads.append([x.grad, *(p.grad for p in params)])
    assert all(a is not None and torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
