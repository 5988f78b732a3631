"""Every refusal of ``layout.check_runnable`` reaches the user the same way through every entry
point: the ``meshwise.parallelize`` API (MeshwiseError before any process group), and the train,
measure and plan --layout commands (one line, exit status 2, nothing written or started)."""

from __future__ import annotations

import pytest

from _models import micro_model
from meshwise.cli import main
from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, check_runnable, parse, runs_here
from meshwise.spec import load_model

GLOBAL_BATCH = 8
# (name, layout text, seq_len, extra model lines, what the message must say); 2 ranks each.
REFUSALS = [
    ("longer than max_seq", "dp=2", 64, "", "longer than the model's max_seq 32"),
    ("sp needs seq divisible by tp", "tp=2,sp=on", 15, "", "sp=on needs the sequence (15) divisible by tp=2"),
    ("tied embeddings with pp", "pp=2", 16, "tied_embeddings = true\n", "tied embeddings"),
    (
        "zero-bubble with selective AC",
        "pp=2,vpp=1,schedule=zero-bubble,ac=selective",
        16,
        "",
        "ac=selective with schedule=zero-bubble",
    ),
    ("cp needs seq divisible by 2*cp", "cp=2", 14, "", "cp=2 needs the sequence (14) divisible by 2"),
    ("world size", "dp=4", 16, "", "but the world size is 2"),
    ("tp does not divide heads", "tp=2,sp=off", 16, "heads = 1\nkv_heads = 1\n", "does not divide the model's heads"),
]
IDS = [r[0] for r in REFUSALS]


def _model_file(tmp_path, extra: str) -> str:
    if "heads" in extra:  # replace the default head counts instead of repeating the keys
        path = micro_model(tmp_path)
        text = open(path).read().replace("heads = 2\nkv_heads = 2\n", extra)
        open(path, "w").write(text)
        return path
    return micro_model(tmp_path, extra)


def _one_line(capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.startswith("meshwise: error:") and needle in err and "\n" not in err, err


@pytest.mark.parametrize("name,text,seq,extra,needle", REFUSALS, ids=IDS)
def test_check_runnable_refuses(tmp_path, name, text, seq, extra, needle) -> None:
    model = load_model(_model_file(tmp_path, extra))
    layout = parse(text)
    with pytest.raises(MeshwiseError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_runnable(layout, model, 2, GLOBAL_BATCH, seq)
    if name not in ("longer than max_seq", "world size", "tp does not divide heads"):
        assert not runs_here(model, seq)(layout)  # the planner's where= filter agrees


def test_a_runnable_layout_passes(tmp_path) -> None:
    model = load_model(micro_model(tmp_path))
    for text in ("dp=2", "tp=2,sp=on", "pp=2", "pp=2,vpp=1,schedule=zero-bubble,ac=full", "cp=2"):
        check_runnable(parse(text, 2), model, 2, GLOBAL_BATCH, 16)
        assert runs_here(model, 16)(parse(text, 2))


@pytest.mark.parametrize("name,text,seq,extra,needle", REFUSALS, ids=IDS)
def test_parallelize_api(tmp_path, name, text, seq, extra, needle) -> None:
    from meshwise.runtime import parallelize

    class FakeMesh:  # parallelize checks before it touches the mesh's groups
        def size(self) -> int:
            return 2

    model = load_model(_model_file(tmp_path, extra))
    with pytest.raises(MeshwiseError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parallelize(model, parse(text), FakeMesh(), global_batch=GLOBAL_BATCH, seq_len=seq)  # type: ignore[arg-type]


@pytest.mark.parametrize("name,text,seq,extra,needle", REFUSALS, ids=IDS)
def test_train_cli(tmp_path, capsys, name, text, seq, extra, needle) -> None:
    args = [
        "train",
        "--model",
        _model_file(tmp_path, extra),
        "--layout",
        text,
        "--seq-len",
        str(seq),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--nproc-per-node",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--metrics",
        str(tmp_path / "m.jsonl"),
    ]
    assert main(args) == 2
    _one_line(capsys, needle)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize("name,text,seq,extra,needle", REFUSALS, ids=IDS)
def test_measure_cli(tmp_path, capsys, name, text, seq, extra, needle) -> None:
    report = tmp_path / "run.html"
    args = [
        "measure",
        "--model",
        _model_file(tmp_path, extra),
        "--layout",
        text,
        "--seq-len",
        str(seq),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--nproc-per-node",
        "2",
        "--report",
        str(report),
    ]
    assert main(args) == 2
    _one_line(capsys, needle)
    assert not report.exists()


@pytest.mark.parametrize("name,text,seq,extra,needle", REFUSALS, ids=IDS)
def test_plan_layout(tmp_path, capsys, name, text, seq, extra, needle) -> None:
    report = tmp_path / "plan.html"
    args = [
        "plan",
        "--model",
        _model_file(tmp_path, extra),
        "--gpu",
        "cpu",
        "--gpus",
        "2",
        "--layout",
        text,
        "--seq-len",
        str(seq),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--report",
        str(report),
    ]
    assert main(args) == 2
    _one_line(capsys, needle)
    assert not report.exists()


def test_layout_refusal_is_the_same_text_everywhere(tmp_path, capsys) -> None:
    """One owner: the message of each entry point is check_runnable's, word for word."""
    model_file = micro_model(tmp_path, "tied_embeddings = true\n")
    with pytest.raises(MeshwiseError) as err:
        check_runnable(Layout(pp=2), load_model(model_file), 2, GLOBAL_BATCH, 16)
    for args in (
        ["plan", "--gpu", "cpu", "--gpus", "2", "--seq-len", "16", "--global-batch", "8"],
        ["measure", "--nproc-per-node", "2", "--seq-len", "16", "--global-batch", "8"],
    ):
        assert main([*args, "--model", model_file, "--layout", "pp=2"]) == 2
        assert capsys.readouterr().err.strip() == f"meshwise: error: {err.value}"


MESHWISE_ONLY = [  # meshwise's own runtime limits: Megatron-LM runs these
    ("tied embeddings with pp", "pp=2", 16, "tied_embeddings = true\n"),
    ("zero-bubble with selective AC", "pp=2,vpp=1,schedule=zero-bubble,ac=selective", 16, ""),
    ("sp with learned positions", "tp=2,sp=on", 16, 'position = "learned"\n'),
]


@pytest.mark.parametrize("name,text,seq,extra", MESHWISE_ONLY, ids=[r[0] for r in MESHWISE_ONLY])
def test_megatron_runtime_answers_what_megatron_runs(tmp_path, capsys, name, text, seq, extra) -> None:
    """plan --runtime megatron evaluates the layout (exit 0); the same plan for meshwise's runtime, and
    train, refuse it in one line."""
    model = _model_file(tmp_path, extra)
    args = [
        "plan",
        "--model",
        model,
        "--gpu",
        "h100",
        "--gpus",
        "2",
        "--layout",
        text,
        "--seq-len",
        str(seq),
        "--global-batch",
        str(GLOBAL_BATCH),
    ]
    assert main(args + ["--runtime", "megatron"]) == 0
    assert "Evaluated:" in capsys.readouterr().out
    assert main(args + ["--runtime", "meshwise"]) == 2
    _one_line(capsys, "not supported by the runtime")


def test_megatron_runtime_keeps_the_sequence_splits(tmp_path, capsys) -> None:
    """Megatron-LM splits the sequence over cp and sp too: an indivisible one is refused for it as well."""
    args = [
        "plan",
        "--model",
        micro_model(tmp_path),
        "--gpu",
        "h100",
        "--gpus",
        "2",
        "--layout",
        "tp=2,sp=on",
        "--seq-len",
        "15",
        "--global-batch",
        str(GLOBAL_BATCH),
        "--runtime",
        "megatron",
    ]
    assert main(args) == 2
    _one_line(capsys, "divisible by tp=2")


def test_published_megatron_gpt_layout_with_tied_embeddings_and_pp(capsys) -> None:
    """Narayanan et al. 2021's GPT 39.1B layout (tied embeddings, TP 8, PP 2) from the command line."""
    args = [
        "plan",
        "--model",
        "gpt-39.1b",
        "--gpu",
        "a100-80gb",
        "--gpus",
        "512",
        "--global-batch",
        "1536",
        "--seq-len",
        "2048",
        "--runtime",
        "megatron",
        "--layout",
        "dp=32,tp=8,pp=2,vpp=6,schedule=interleaved-1f1b,mbs=16,ac=full",
    ]
    assert main(args) == 0
    assert "Evaluated:" in capsys.readouterr().out
