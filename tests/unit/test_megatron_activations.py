"""Megatron-Core's activation accounting (cost/megatron_memory.py) against its sources: Korthikanti et al.
2022's per-layer inventory, Megatron-Core's schedules and recompute modules, and DeepSeek-V3's memory-saving
recipe (arXiv 2412.19437 Sec. 3.2.3, 3.3.3); and the two largest published layouts judged by it."""

from __future__ import annotations

import pytest

from meshwise.cost import activations as act
from meshwise.cost import megatron_memory as mm
from meshwise.cost.estimate import estimate
from meshwise.cost.memory import rank_shapes
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

LLAMA_405B = "dp=128,zero=2,tp=8,sp=on,pp=16,vpp=4"
DEEPSEEK_V3 = "dp=128,zero=1,ep=64,pp=16"


def _bf16(seq: int, batch: int) -> TrainSpec:
    return TrainSpec(batch, seq, runtime="megatron")


def _fp8_blockwise(seq: int, batch: int) -> TrainSpec:
    return TrainSpec(batch, seq, precision="fp8-blockwise", runtime="megatron")


def test_gpt_block_is_korthikanti_table2_without_dropout_and_scores():
    """A GPT model (GeLU 4h, MHA, Narayanan et al. 2021's 145.6B), tp=8 with SP: Table 2's ``34 s b h / t``
    less its two ``s b h`` dropout masks (the attention-dropout mask and output belong to the ``5 a s^2 b``
    term TE's fused attention does not keep), plus what the paper leaves out: two fp32 rsigma and the fp32
    log-sum-exp per head."""
    model = load_model("gpt-145.6b")
    s, b, t = 2048, 1, 8
    h, a = model.hidden, model.heads
    kept, _ = mm._block_kept(model, _bf16(s, 64), t, True, b, "none", 1, False)
    paper = act.korthikanti_table2(s, b, h, a, t, "tp+sp") - 5 * a * s * s * b / t
    masks = 2 * s * b * h / t
    assert kept == pytest.approx(paper - masks + s * b * (2 * 4 / t + 4 * a / t))


def test_llama3_405b_block_by_hand():
    """One Llama 3 405B block at tp=8, SP, seq 8192: block input, norm output (fc-input), Q K V (GQA 8 KV
    heads), attention output, residual, norm output, SwiGLU input 2f and fc2 input f, all /t, 2 bytes each;
    two rsigma and the LSE in fp32. Megatron's layernorm recompute does not apply (TE fuses the norms into
    linear_qkv and linear_fc1), moe_act neither: selective keeps the same."""
    model, t, s = load_model("llama3-405b"), 8, 8192
    h, q, kv, f = model.hidden, model.heads * model.head_dim, model.kv_dim, model.ffn_hidden
    per_token = 2 * (4 * h + q + 2 * kv + q + 3 * f) / t + 2 * 4 / t + 4 * model.heads / t
    for ac in ("none", "selective"):
        kept, recomputing = mm._block_kept(model, _bf16(s, 2048), t, True, 1, ac, 1, False)
        assert kept == pytest.approx(s * per_token)
        assert recomputing == 0
    assert s * per_token == pytest.approx(0.5332e9, rel=1e-3)


def test_interleaved_in_flight_pp16_vpp4_m16():
    """Megatron's get_pp_rank_microbatches: warm-up ``2 (p - r - 1) + (v - 1) N`` with N = p (its group size
    must lie in [p, m]), one more forward before the first backward, at most ``m v``: with m = p = 16 the
    first eight ranks run every forward first. Rank 1 holds 4 chunks x 16 micro-batches = 128
    block-micro-batches (2 blocks per chunk)."""
    model = load_model("llama3-405b")
    layout = parse(LLAMA_405B, 16384)
    m, p, v = 2048 // 128, 16, 4
    for shape in rank_shapes(model, layout):
        warmup = 2 * (p - shape.pp_rank - 1) + (v - 1) * p
        chunk_mbs = min(m * v, warmup + 1)
        held = mm._blocks_in_flight("interleaved-1f1b", p, v, m, shape)
        if chunk_mbs == m * v:
            assert held == m * shape.blocks
        assert held <= m * shape.blocks
    assert max(mm._blocks_in_flight("interleaved-1f1b", p, v, m, sh) for sh in rank_shapes(model, layout)) == 128


def test_fp8_blockwise_caches_linear_inputs_in_float8():
    """DeepSeek-V3 Sec. 3.3.3: the Linear's backward input cached in FP8 with 1x128 tiles (one fp32 scale
    each); bf16 elsewhere."""
    assert mm.linear_input_bytes(_fp8_blockwise(4096, 8)) == pytest.approx(1 + 4 / 128)
    assert mm.linear_input_bytes(_bf16(4096, 8)) == 2
    assert mm.linear_input_bytes(TrainSpec(8, 4096, precision="fp8", runtime="megatron")) == 2  # not modelled


def test_mla_norm_and_up_projection_recompute():
    """DeepSeek-V3 Sec. 3.2.3 (Megatron's layernorm + mla_up_proj): neither the input norm's output (two float8
    copies, one per down projection) nor the latent norms' outputs and rsigma nor Q, K, V after RoPE are kept;
    the latents, the block input, the attention output and LSE are."""
    model, train = load_model("deepseek-v3"), _fp8_blockwise(4096, 8)
    a, c = model.heads, 1 + 4 / 128
    none = mm.attention_token_bytes(model, train, 1, False, False)
    sel = mm.attention_token_bytes(model, train, 1, False, True)
    qkv = 2 * (2 * a * model.head_dim + a * model.v_head_dim)
    norms = 2 * c * model.hidden + c * (model.q_lora_rank + model.kv_lora_rank) + 2 * 4
    assert none - sel == pytest.approx(qkv + norms)
    latents = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
    assert sel == pytest.approx(2 * model.hidden + 4 + 2 * latents + 2 * a * model.v_head_dim + 4 * a)


def test_moe_swiglu_inputs_in_float8_and_outputs_recomputed():
    """DeepSeek-V3 Sec. 3.3.3: the MoE SwiGLU's inputs cached in FP8, its output recomputed (moe_act); the
    dispatched tokens (fc1's input) in FP8; the MLP norm recomputed (layernorm). Per routed copy on the
    busiest EP rank (capacity 1.25): ``c (h + 2 f_e)`` and the fp32 probability."""
    model, train = load_model("deepseek-v3"), _fp8_blockwise(4096, 8)
    c, h, fe = 1 + 4 / 128, model.hidden, model.expert_ffn_hidden
    _, none = mm.mlp_token_bytes(model, train, 1, False, False, 64, False)
    _, sel = mm.mlp_token_bytes(model, train, 1, False, True, 64, False)
    copies = act.CAPACITY_FACTOR * model.experts_per_token
    assert none - sel == pytest.approx(copies * fe * c + 2 * h)  # SwiGLU outputs, the norm's bf16 output
    shared = h * c + model.shared_ffn_hidden * (2 * 2 + c)
    residual, router = 2 * h + 4, model.experts * (2 + 4)
    assert sel == pytest.approx(residual + router + copies * (c * (h + 2 * fe) + 4) + shared)


def test_deepseek_v3_layout_fits_on_2048_h800_in_fp8_blockwise():
    """DeepSeek-V3's published layout (PP16, EP64, ZeRO-1, seq 4096, batch 15360; DualPipe taken as 1F1B)
    with its recipe's recomputation (``ac=selective``) fits within 72 GB, under the marketed 80 GB less 10%
    as well as the 76.4 GB usable of what the device gives; without recompute it does not."""
    model, cluster = load_model("deepseek-v3"), load_cluster("h800", 2048)
    train = _fp8_blockwise(4096, 15360)
    sel = estimate(model, cluster, train, parse(DEEPSEEK_V3 + ",ac=selective", 2048))
    assert sel.fits and sel.memory.total < 0.9 * 80e9
    assert not estimate(model, cluster, train, parse(DEEPSEEK_V3, 2048)).fits


def test_llama3_405b_layout_fits_megatron_without_recompute():
    """Meta's layout under Megatron-Core (interleaved, m = p = 16): 128 block-micro-batches of 0.533 GB on the
    heaviest rank and 6.8 GB of states: 75.0 GB, under the 76.4 GB usable of an H100 (79.11 GiB given to the
    program, 10% kept free); Megatron's selective recompute changes nothing in a dense TE block. With TP
    communication overlap turned on (not Megatron-LM's default) its 3.2 GB of userbuffers push it over."""
    model, cluster = load_model("llama3-405b"), load_cluster("h100", 16384)
    usable = 0.9 * cluster.accelerator.memory_bytes
    for ac in ("none", "selective"):
        e = estimate(model, cluster, _bf16(8192, 2048), parse(f"{LLAMA_405B},ac={ac}", 16384))
        assert e.fits and e.memory.other == 0
        assert 128 * 0.533e9 < e.memory.activations and 0.95 * usable < e.memory.total < usable
    overlapped = estimate(
        model, cluster, TrainSpec(2048, 8192, runtime="megatron", overlap_tp_comm=True), parse(LLAMA_405B, 16384)
    )
    assert not overlapped.fits and overlapped.memory.other == pytest.approx(8192 * model.hidden * 24)
    assert estimate(model, cluster, _bf16(8192, 2048), parse(f"{LLAMA_405B},ac=full", 16384)).fits


@pytest.mark.parametrize("m", [16, 24, 32, 64])
def test_in_flight_is_megatron_core_warmup(m):
    """pipeline.in_flight against megatron-core 0.16.1's own get_pp_rank_microbatches (its group size per
    virtual stage defaults to p, ModelParallelConfig): a rank holds its warm-up forwards and one more, or all
    ``m v`` chunk-micro-batches when every forward runs in the warm-up (m = p = 16: ranks 0-7)."""
    pytest.importorskip("megatron.core", reason="megatron-core is the oracle of the interleaved schedule")
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    from meshwise.cost import pipeline

    p, v = 16, 4
    for r in range(p):
        group = SimpleNamespace(size=lambda: p, rank=lambda r=r: r)
        comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=v)
        total, all_warmup, warmup, _ = get_pp_rank_microbatches(m, v, p, p2p_communicator=comm)
        assert pipeline.in_flight("interleaved-1f1b", p, v, m, r) == (total if all_warmup else warmup + 1)
