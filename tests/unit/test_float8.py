"""Float8 training's single-process parts (meshwise.runtime.float8): which linears are converted,
what is refused, the config field, and that a float8 step really quantises (torchao as oracle)."""

from __future__ import annotations

import copy

import pytest
import torch

from meshwise.errors import MeshwiseError
from meshwise.spec import load_model

pytest.importorskip("torchao")

from meshwise.runtime import build_model, float8, loss_sum  # noqa: E402
from meshwise.runtime.model import Transformer  # noqa: E402


def _meta(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(load_model(name))


def test_block_linears_convert_and_the_head_and_router_do_not() -> None:
    conv = float8.convert(_meta("tiny-moe"), "fp8")
    skipped = dict(conv.skipped)
    assert skipped.pop("output") == "the head"
    assert skipped and all(name.endswith(("router", "shared_gate")) for name in skipped)
    assert "layers.0.attention.wq" in conv.converted
    model = _meta("tiny")
    conv = float8.convert(model, "fp8-rowwise")
    assert len(conv.converted) == 4 * 7 and [n for n, _ in conv.skipped] == ["output"]
    assert float8.is_float8_linear(model.layers["0"].mlp.w2) and not float8.is_float8_linear(model.output)
    assert type(model.tok_embeddings) is torch.nn.Embedding


def test_tp_shards_must_stay_multiples_of_16() -> None:
    """tiny's MLP is 176 wide: 88 per rank under tp=2, which float8 GEMMs cannot take; attention's
    64-wide Q (32 per rank) and 32-wide K/V (16) can."""
    conv = float8.convert(_meta("tiny"), "fp8", tp=2)
    skipped = dict(conv.skipped)
    assert skipped["layers.0.mlp.w2"] == "88x64 per TP rank (tp=2), not multiples of 16"
    assert {"layers.0.attention.wq", "layers.0.attention.wk", "layers.0.attention.wo"} <= set(conv.converted)
    assert not any(".mlp." in n for n in conv.converted)
    assert "12 more" in conv.line() or "9 more" in conv.line()


@pytest.mark.parametrize("precision", ["fp8-blockwise", "mxfp8"])
def test_planned_only_formats_are_refused_in_one_line(precision: str) -> None:
    with pytest.raises(MeshwiseError, match=f"--precision {precision}: planned only") as e:
        float8.resolve(precision, "cpu")
    assert "\n" not in str(e.value)


def test_resolve_names_the_device_precision() -> None:
    assert float8.resolve("auto", "cpu") is None and float8.resolve("fp32", "cpu") is None
    assert float8.resolve("fp8", "cpu") == "fp8"
    with pytest.raises(MeshwiseError, match="trains in fp32 on cpu"):
        float8.resolve("bf16", "cpu")


def test_train_config_takes_precision() -> None:
    from meshwise.train.command import resolve

    _, cfg = resolve(["--precision", "fp8-rowwise"])
    assert cfg.layout.precision == "fp8-rowwise"
    with pytest.raises(MeshwiseError, match="--layout.precision: 'fp4' is not one of auto"):
        resolve(["--precision", "fp4"])


def test_a_float8_step_quantises() -> None:
    """One forward and backward: every matrix multiply of a converted linear (3 per linear: output,
    input gradient, weight gradient) takes torchao's float8 tensors, holding e4m3 / e5m2 data, and
    the loss differs from the fp32 model's (by quantisation, not by much)."""
    spec = load_model("tiny")
    x = torch.randint(0, spec.vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    plain = build_model(spec, 0)
    fp8 = build_model(spec, 0)
    float8.convert(fp8, "fp8")
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default and type(args[0]).__name__ == "Float8TrainingTensor":
                seen.append(args[0]._data.dtype)
                seen.append(args[1]._data.dtype)
            return func(*args, **(kwargs or {}))

    with Spy():
        loss = loss_sum(fp8(x[:, :-1]), x[:, 1:])
        loss.backward()
    want = loss_sum(plain(x[:, :-1]), x[:, 1:])
    assert len(seen) == 2 * 3 * 28 and set(seen) == {torch.float8_e4m3fn, torch.float8_e5m2}
    assert 0 < abs(loss.item() - want.item()) < 1e-3 * want.item()


def test_cpu_float8_gemms_equal_torchaos_emulation() -> None:
    """The float8 GEMMs this CPU runs (``torch._scaled_mm``) give what torchao's emulation gives (its
    reference: float8 values and scales multiplied in fp32), forward and both gradients: the loss
    difference float8 makes on CPU is float8's rounding, not the CPU kernel's."""
    from dataclasses import replace

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(192, 512, bias=False))
    x = torch.randn(256, 192)
    grad_out = torch.randn(256, 512)
    outputs = []
    for emulate in (False, True):
        m = copy.deepcopy(plain)
        config = float8.linear_config("fp8")
        float8._torchao().convert_to_float8_training(m, config=replace(config, emulate=emulate))
        xx = x.clone().requires_grad_()
        y = m(xx)
        y.backward(grad_out)
        outputs.append((y.detach(), xx.grad, m[0].weight.grad))
    hp = plain(x)
    for got, want in zip(*outputs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert (outputs[0][0] - hp).norm() > 1e-2 * hp.norm()  # float8 really rounded (e4m3: ~4%)


def test_tied_head_stays_the_embedding_in_high_precision() -> None:
    """``small`` ties its head to the embedding: after conversion the head is still a plain
    ``nn.Linear`` sharing the embedding's fp32 weight, so the logits never go through float8."""
    model = build_model(load_model("tiny-tied"), 0)
    float8.convert(model, "fp8")
    assert type(model.output) is torch.nn.Linear and model.output.weight is model.tok_embeddings.weight
    assert model.output.weight.dtype == torch.float32
