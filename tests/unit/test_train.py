"""meshwise train, single process: config, data order, checkpoint folders, bad input, export/generate.

Bad input is refused in one line with exit status 2 and nothing written. The multi-process
scenarios (kill and restart, reshaping, two nodes) are in test_train_dist.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _cli import meshwise_here
from _models import micro_model
from meshwise.cli import main
from meshwise.errors import MeshwiseError
from meshwise.train import checkpoint, config, embedded_corpus
from meshwise.train.data import build_corpus
from meshwise.train.loop import lr_at


def meshwise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """One-process commands: in this process (tests/_cli.py)."""
    return meshwise_here(*args, cwd=cwd)


# -------------------------------------------------------------------------------------- config
def test_config_file_overrides_and_print_config(tmp_path, capsys) -> None:
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text("[optimizer]\nlr = 1\n[schedule]\nsteps = 7\n[data]\nseq_len = 16\n")
    assert (
        main(["train", "--config", str(cfg_file), "--steps", "9", "--optimizer.beta2", "0.99", "--print-config"]) == 0
    )
    printed = capsys.readouterr().out
    (tmp_path / "printed.toml").write_text(printed)
    cfg = config.load(str(tmp_path / "printed.toml"))
    assert (cfg.optimizer.lr, cfg.schedule.steps, cfg.optimizer.beta2, cfg.data.seq_len) == (1.0, 9, 0.99, 16)
    assert cfg.model == config.ModelConfig()  # untouched sections keep their defaults


@pytest.mark.parametrize(
    "text,message",
    [
        ("[optimizer]\nlearning_rate = 0.1\n", "unknown key optimizer.learning_rate"),
        ("[optimiser]\nlr = 0.1\n", "unknown section [optimiser]"),
        ('[schedule]\nsteps = "ten"\n', "schedule.steps: expected int, got str"),
        ("[checkpoint]\nkeep = true\n", "checkpoint.keep: expected int, got bool"),
    ],
)
def test_bad_config_file_is_one_line_exit_2(tmp_path, capsys, text, message) -> None:
    cfg_file = tmp_path / "bad.toml"
    cfg_file.write_text(text)
    assert main(["train", "--config", str(cfg_file), "--checkpoint-dir", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("meshwise: error:") and "\n" not in err
    assert not (tmp_path / "ck").exists()


def test_bad_command_line_values(capsys) -> None:
    assert main(["train", "--steps", "many"]) == 2
    assert "--schedule.steps: 'many' is not a valid int" in capsys.readouterr().err
    assert main(["train", "--optimizer.learning_rate", "1"]) == 2
    assert "unrecognized arguments: --optimizer.learning_rate" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- data
def test_embedded_corpus_is_the_generators_output() -> None:
    shipped = embedded_corpus.read()
    assert shipped == embedded_corpus.generate().encode()
    assert 200_000 < len(shipped) < 400_000 and max(shipped) < 128


def test_sample_order_is_a_function_of_seed_and_index(tmp_path) -> None:
    data = config.DataConfig(seq_len=16)
    a, b = build_corpus(data, 256), build_corpus(data, 256)
    # Rows 3..5 of step 7 are the same whoever asks, whatever else was asked before.
    b.train_rows(0, range(100))
    x1, y1 = a.train_rows(7 * 8, range(3, 6))
    x2, y2 = b.train_rows(7 * 8, range(3, 6))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one
    # Two replicas of one step, and the steps of one epoch, never share a sequence.
    first = [a.train_window(g) for g in range(a.n_train)]
    assert sorted(first) == list(range(a.n_train))
    assert all(w < a.n_train for w in first)  # held-out windows never appear in training
    other_seed = build_corpus(config.DataConfig(seq_len=16, seed=9), 256)
    assert [other_seed.train_window(g) for g in range(8)] != first[:8]


def test_text_folder_and_bin_inputs(tmp_path) -> None:
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("hello world " * 40)
    (tmp_path / "txt" / "b.txt").write_text("second file " * 40)
    corpus = build_corpus(config.DataConfig(path=str(tmp_path / "txt"), seq_len=16), 256)
    assert corpus.tokens.numel() == 480 + 2 + 480
    ids = torch.arange(1000, dtype=torch.int32) % 300
    (tmp_path / "ids.bin").write_bytes(bytes(ids.to(torch.int16).view(torch.uint8).tolist()))  # uint16, little-endian
    corpus = build_corpus(config.DataConfig(path=str(tmp_path / "ids.bin"), seq_len=16), 512)
    assert corpus.tokens.numel() == 1000 and int(corpus.window(2)[0]) == 32
    with pytest.raises(MeshwiseError, match="token id 299, outside the model's vocabulary of 256"):
        build_corpus(config.DataConfig(path=str(tmp_path / "ids.bin"), seq_len=16), 256)


# ---------------------------------------------------------------------------- schedule, folders
def test_warmup_then_cosine() -> None:
    s, o = config.ScheduleConfig(steps=110, warmup_steps=10), config.OptimizerConfig(lr=1.0, min_lr=0.1)
    assert lr_at(5, s, o) == pytest.approx(0.5) and lr_at(10, s, o) == pytest.approx(1.0)
    assert lr_at(60, s, o) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_at(110, s, o) == pytest.approx(0.1)


def test_only_committed_checkpoints_count(tmp_path) -> None:
    for name, commit in (("step-5", True), ("step-10", True), ("step-15.tmp", True), ("step-20", False)):
        (tmp_path / name).mkdir()
        if commit:
            (tmp_path / name / checkpoint.COMMIT_FILE).write_text("{}")
    assert [s for s, _ in checkpoint.complete_checkpoints(tmp_path)] == [5, 10]
    assert checkpoint.latest(tmp_path) == tmp_path / "step-10"
    assert checkpoint.resolve_resume("auto", str(tmp_path / "none")) == (None, [])
    with pytest.raises(MeshwiseError, match="not a complete meshwise checkpoint"):
        checkpoint.resolve_resume(str(tmp_path / "step-20"), str(tmp_path))


# ----------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "case",
    [
        "missing data",
        "empty file",
        "empty folder",
        "layout vs world",
        "seq longer than model",
        "resume missing",
        "compile with pp",
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case) -> None:
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "empty_dir").mkdir()
    extra = {
        "missing data": ["--data", str(tmp_path / "nope.txt")],
        "empty file": ["--data", str(tmp_path / "empty.txt")],
        "empty folder": ["--data", str(tmp_path / "empty_dir")],
        "layout vs world": ["--layout", "dp=2,tp=2", "--nproc-per-node", "2"],
        "seq longer than model": ["--seq-len", "64"],
        "resume missing": ["--resume", str(tmp_path / "ck" / "step-3")],
        "compile with pp": ["--compile", "--layout", "pp=2", "--nproc-per-node", "2"],
    }[case]
    expected = {
        "missing data": "nope.txt does not exist",
        "empty file": "is empty",
        "empty folder": "holds no files",
        "layout vs world": "but the world size is 2",
        "seq longer than model": "longer than the model's max_seq 32",
        "resume missing": "does not exist",
        "compile with pp": "compile: not supported with pipeline parallelism (pp=2)",
    }[case]
    args = [
        "train",
        "--model",
        micro_model(tmp_path),
        "--seq-len",
        "16",
        *(["--nproc-per-node", "1"] * ("--nproc-per-node" not in extra)),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--metrics",
        str(tmp_path / "m.jsonl"),
        *extra,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("meshwise: error:") and expected in err and "\n" not in err, err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "m.jsonl").exists()


# ------------------------------------------------------------------------- export and generate


def test_plan_does_not_import_torch_with_train_commands_registered() -> None:
    code = (
        "import sys\nfrom meshwise.cli import build_parser\nbuild_parser()\n"
        "import meshwise.train, meshwise.train.config, meshwise.train.command\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stop_grace_reaches_the_launcher_and_bad_values_are_one_line(monkeypatch) -> None:
    """``--stop-grace`` is the elastic agent's shutdown timeout (its SIGKILL after a forwarded SIGTERM)."""
    from torch.distributed.launcher import api

    from meshwise import launch
    from meshwise.train.command import resolve

    assert resolve(["--stop-grace", "90"])[1].checkpoint.stop_grace == 90.0
    assert resolve([])[1].checkpoint.stop_grace == 30.0  # torch's own default, and Slurm's KillWait
    for bad in ("0", "nan", "-5"):
        with pytest.raises(MeshwiseError, match="stop_grace"):
            resolve(["--stop-grace", bad])
    seen = {}

    def fake_launch(cfg, entrypoint):
        seen["timeout"] = cfg.shutdown_timeout
        return lambda *args: None

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    launch.launch_local("meshwise.train", [], 2, stop_grace_s=7.5)
    assert seen["timeout"] == 8
