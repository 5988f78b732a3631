"""Damaged and hostile checkpoints: ``train --resume``, ``export`` and ``generate`` each refuse them
with exit status 2 and one line naming the file and what is wrong, before any model is built; a
pickled payload in ``.metadata`` never runs; ``--resume auto`` passes over a damaged newest
checkpoint to the previous complete one, saying so."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from _cli import meshwise_here
from meshwise.cli import main

MICRO = "[model]\nlayers = 2\nhidden = 32\nheads = 2\nkv_heads = 2\nffn_hidden = 64\nvocab = 256\nmax_seq = 32\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A micro model's run with complete checkpoints step-2 and step-3."""
    folder = tmp_path_factory.mktemp("trained")
    (folder / "micro.toml").write_text(MICRO)
    r = meshwise_here(
        "train",
        "--model",
        "micro.toml",
        "--seq-len",
        "16",
        "--steps",
        "3",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        "ck",
        "--checkpoint-every",
        "1",
        "--keep",
        "2",
        "--prompt=",
        "--eval-every",
        "0",
        cwd=folder,
    )
    assert r.returncode == 0, r.stderr
    return folder


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _shard(ck: Path) -> Path:
    return sorted(ck.glob("*.distcp"))[0]


def _json(ck: Path, text: str) -> None:
    (ck / "meshwise.json").write_text(text)


def _absurd(ck: Path) -> None:
    meta = json.loads((ck / "meshwise.json").read_text())
    meta["model"].update(hidden=1 << 20, ffn_hidden=1 << 21, layers=1000)
    (ck / "meshwise.json").write_text(json.dumps(meta))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(bytes((i * 7 + 3) % 256 for i in range(path.stat().st_size)))


# (case, damage done to a copy of step-3, text naming the file and the fault)
DAMAGE = [
    ("meshwise-json-garbage", lambda ck: _json(ck, "{not json"), "meshwise.json: not valid JSON"),
    ("meshwise-json-list", lambda ck: _json(ck, "[1, 2]"), "meshwise.json: expected a JSON object, got list"),
    ("meshwise-json-without-model", lambda ck: _json(ck, '{"step": 3}'), "meshwise.json: no 'model' object"),
    ("shard-missing", lambda ck: _shard(ck).unlink(), "__0_0.distcp: missing"),
    ("shard-truncated", lambda ck: _truncate(_shard(ck)), "__0_0.distcp: truncated"),
    ("shard-garbage", lambda ck: _garbage(_shard(ck)), "a shard (*.distcp) is damaged"),
    ("metadata-missing", lambda ck: (ck / ".metadata").unlink(), ".metadata: missing"),
    ("metadata-garbage", lambda ck: _garbage(ck / ".metadata"), ".metadata: "),
    ("metadata-truncated", lambda ck: _truncate(ck / ".metadata"), ".metadata: damaged"),
    ("absurd-shape", _absurd, "meshwise.json"),  # export/generate: against .metadata; train: against its model
]
COMMANDS = ["export", "generate", "train-resume"]


def _command(which: str, ck: Path, folder: Path) -> list[str]:
    if which == "export":
        return ["export", "--checkpoint", str(ck), "--out", str(folder / "out" / "m.safetensors")]
    if which == "generate":
        return ["generate", "--checkpoint", str(ck), "--prompt", "1 +", "--tokens", "3"]
    (folder / "micro.toml").write_text(MICRO)
    return [
        "train",
        "--model",
        str(folder / "micro.toml"),
        "--seq-len",
        "16",
        "--steps",
        "4",
        "--nproc-per-node",
        "1",
        "--checkpoint-dir",
        str(folder / "ck2"),
        "--resume",
        str(ck),
        "--prompt=",
        "--eval-every",
        "0",
    ]


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("meshwise: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("which", COMMANDS)
@pytest.mark.parametrize("damage,expected", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_checkpoint_is_one_line_naming_the_file(trained, tmp_path, capsys, which, damage, expected) -> None:
    ck = tmp_path / "step-3"
    shutil.copytree(trained / "ck" / "step-3", ck)
    damage(ck)
    assert main(_command(which, ck, tmp_path)) == 2
    err = _one_line(capsys)
    assert expected in err and str(ck) in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "ck2").exists()


@pytest.mark.parametrize("which", COMMANDS)
def test_pickled_payload_in_metadata_is_refused_and_never_runs(trained, tmp_path, capsys, which) -> None:
    ck = tmp_path / "step-3"
    shutil.copytree(trained / "ck" / "step-3", ck)
    marker = tmp_path / "PAYLOAD-RAN"
    (ck / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    assert main(_command(which, ck, tmp_path)) == 2
    err = _one_line(capsys)
    assert ".metadata: refused, not DCP metadata (posix.system is not part of" in err, err
    assert not marker.exists()


def test_resume_auto_falls_back_past_a_damaged_newest_checkpoint(trained, tmp_path, capsys) -> None:
    shutil.copytree(trained / "ck", tmp_path / "ck")
    _truncate(_shard(tmp_path / "ck" / "step-3"))
    (tmp_path / "micro.toml").write_text(MICRO)
    assert (
        main(
            [
                "train",
                "--model",
                str(tmp_path / "micro.toml"),
                "--seq-len",
                "16",
                "--steps",
                "4",
                "--nproc-per-node",
                "1",
                "--checkpoint-dir",
                str(tmp_path / "ck"),
                "--resume",
                "auto",
                "--checkpoint-every",
                "1",
                "--keep",
                "5",
                "--prompt=",
                "--eval-every",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "--resume auto: passing over step-3:" in out and "__0_0.distcp: truncated" in out, out
    assert f"--resume auto: falling back to {tmp_path / 'ck' / 'step-2'}" in out
    assert f"Resumed from {tmp_path / 'ck' / 'step-2'} (step 2," in out
    assert (tmp_path / "ck" / "step-4" / "meshwise.json").is_file()


def test_readme_counts_these_cases() -> None:
    readme = (Path(__file__).parents[2] / "docs/reliability.md").read_text()
    assert f"{len(DAMAGE) * len(COMMANDS)} cases (`tests/unit/test_checkpoint_damage.py`" in readme
