"""Runtime checks that need no process group: refusal before any group exists, lazy import,
name-based initialisation, and that each activation-checkpointing mode changes what is kept."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from meshwise.errors import MeshwiseError
from meshwise.layout import Layout, parse
from meshwise.spec import load_model


@pytest.mark.parametrize(
    "text,world,field",
    [
        ("tp=3", 3, "tp=3 does not divide the model's heads"),
        ("dp=2,tp=2", 8, "but the world size is 8"),
        ("pp=4,vpp=2", 8, "pp*vpp = 8 is more than the model's 4 layers"),
        ("dp=3", 3, "global batch 8 is not divisible by mbs*dp"),
    ],
)
def test_bad_layout_is_refused_before_any_process_group(monkeypatch, text, world, field) -> None:
    from meshwise.runtime import build_mesh

    monkeypatch.setenv("WORLD_SIZE", str(world))
    layout = parse(text, world)
    with pytest.raises(MeshwiseError) as err:
        build_mesh(layout, load_model("tiny"), global_batch=8)
    assert field in str(err.value)
    assert "\n" not in str(err.value)
    assert not dist.is_initialized()


def test_importing_meshwise_does_not_import_torch() -> None:
    code = (
        "import sys, meshwise, meshwise.layout, meshwise.spec\n"
        "assert 'torch' not in sys.modules, 'torch imported eagerly'\n"
        "assert callable(meshwise.parallelize) and 'torch' in sys.modules\n"
        "try:\n    meshwise.no_such_name\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_init_depends_on_seed_and_name_only() -> None:
    from meshwise.runtime import Transformer, build_model, init_weights

    spec = load_model("tiny")
    a, b, c = build_model(spec, seed=0), build_model(spec, seed=0), build_model(spec, seed=1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    # A pipeline chunk (blocks 2..3 + head) initialises to exactly the full model's tensors.
    with torch.device("meta"):
        chunk = Transformer(spec).keep_only(2, 2, first=False, last=True)
    chunk.to_empty(device="cpu")
    init_weights(chunk, spec, seed=0)
    full = dict(a.named_parameters())
    for name, p in chunk.named_parameters():
        assert torch.equal(p, full[name]), name


def _backward_ops_and_grads(mode: str) -> tuple[Counter, list[torch.Tensor]]:
    """Ops run during one block's backward under ``mode``, and the block's gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshwise.runtime import build_model
    from meshwise.runtime.activation_checkpointing import apply_activation_checkpointing

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    spec = load_model("tiny")
    model = build_model(spec, seed=0)
    apply_activation_checkpointing(model, mode)
    x = torch.randint(0, spec.vocab, (2, spec.max_seq), generator=torch.Generator().manual_seed(0))
    block = model.layers["0"]
    h = model.tok_embeddings(x).detach().requires_grad_()
    out = block(h, model.rope_cos, model.rope_sin)
    counter = Count()
    with counter:
        out.square().sum().backward()
    return counter.ops, [p.grad.clone() for p in block.parameters()]


def test_activation_checkpointing_recomputes_what_the_recipe_says() -> None:
    none, g_none = _backward_ops_and_grads("none")
    selective, g_sel = _backward_ops_and_grads("selective")
    full, g_full = _backward_ops_and_grads("full")
    linears = 7  # wq, wk, wv, wo, w1, w2, w3
    # none recomputes nothing; selective reruns the cheap ops (SiLU, norms) but no matmul and no
    # attention; full reruns the block forward with the attention and 6 of its 7 matmuls:
    # non-reentrant checkpointing stops early once every tensor backward needs is rebuilt, and
    # the down projection's output is not one of them.
    assert none["silu"] == 0 and none["rsqrt"] == 0
    assert selective["silu"] == 1 and selective["rsqrt"] == 2
    assert selective["mm"] == none["mm"]
    assert selective["_scaled_dot_product_flash_attention_for_cpu"] == 0
    assert full["mm"] == none["mm"] + linears - 1
    assert full["_scaled_dot_product_flash_attention_for_cpu"] == 1
    for a, b, c in zip(g_none, g_sel, g_full):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def test_selective_recipe_names_ops_this_torch_has() -> None:
    """Every name of the recipe is an aten op of this torch (a misspelt or renamed one would be
    silently ignored by the policy), and every matmul and attention kernel the block's forward
    really dispatches on this machine is one the recipe keeps."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshwise.runtime import build_model
    from meshwise.runtime.activation_checkpointing import SELECTIVE_SAVE_OPS

    missing = [name for name in SELECTIVE_SAVE_OPS if not hasattr(torch.ops.aten, name)]
    assert not missing, f"not aten ops in torch {torch.__version__}: {missing}"

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    spec = load_model("tiny")
    model = build_model(spec, seed=0)
    x = torch.randint(0, spec.vocab, (2, spec.max_seq), generator=torch.Generator().manual_seed(0))
    h = model.tok_embeddings(x).detach().requires_grad_()
    seen = Seen()
    with seen:
        model.layers["0"](h, model.rope_cos, model.rope_sin)
    heavy = {n for n in seen.names if n in ("mm", "addmm", "bmm", "matmul") or "attention" in n}
    assert any("attention" in n for n in heavy), seen.names
    assert heavy <= set(SELECTIVE_SAVE_OPS), f"dispatched but recomputed: {heavy - set(SELECTIVE_SAVE_OPS)}"


def test_parallelize_refuses_tied_embeddings_under_pp() -> None:
    from meshwise.runtime import parallelize
    from meshwise.spec import ModelSpec

    tied = ModelSpec(
        name="tied", layers=2, hidden=32, heads=2, kv_heads=2, ffn_hidden=64, vocab=64, tied_embeddings=True, max_seq=16
    )

    class FakeMesh:  # parallelize validates before it touches the mesh's groups
        def size(self) -> int:
            return 2

    with pytest.raises(MeshwiseError, match="tied embeddings"):
        parallelize(tied, Layout(pp=2), FakeMesh(), global_batch=2)  # type: ignore[arg-type]


def test_a_worker_ends_with_its_code_and_its_output_flushed() -> None:
    """exit_worker skips the interpreter's shutdown (where gloo's threads can abort a process) but
    must keep what the worker printed and the status it returns; end_process_group leaves no group."""
    code = (
        "import sys\n"
        "import torch.distributed as dist\n"
        "from meshwise.runtime.mesh import end_process_group, exit_worker\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "dist.barrier()\n"
        "end_process_group()\n"
        "sys.stdout.write('ended' if not dist.is_initialized() else 'still initialised')\n"
        "sys.stderr.write('unterminated line')\n"
        "exit_worker(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "ended"
    assert proc.stderr.endswith("unterminated line")
