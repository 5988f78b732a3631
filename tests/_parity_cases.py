"""The parity suite's layouts per world size; the measure suite measures the same ones.

Layouts with TP name a micro-batch of half the replica's rows: still two micro-batches (so gradient
accumulation is exercised), and a quarter of the DTensor dispatches of mbs=1, which dominate the
suite's time on CPU (about 150 us per DTensor operator). With PP they keep four micro-batches, so
that a stage's memory peak falls after its first backward, when gradients exist, as the cost model
(which counts them at the peak) assumes."""

from __future__ import annotations

from _dist_parity import Case

CASES: dict[int, list[Case]] = {
    2: [
        Case("dp=2,zero=0"),
        Case("dp=2,zero=1"),
        Case("dp=2,zero=2"),
        Case("dp=2,zero=3"),
        Case("tp=2,sp=off,mbs=4"),
        Case("tp=2,sp=on,mbs=4"),
        Case("pp=2,schedule=gpipe"),
        Case("pp=2,schedule=1f1b"),
        Case("pp=2,vpp=2,schedule=interleaved-1f1b"),
        Case("pp=2,vpp=2,schedule=zero-bubble"),
        Case("dp=2,zero=3,ac=selective"),
        Case("tp=2,sp=on,mbs=4,ac=selective"),
        Case("dp=2,zero=0,ac=full"),
        Case("pp=2,schedule=1f1b,ac=full"),
        # Deliberately wrong runs: the comparison must catch them.
        Case("dp=2,zero=2", corrupt="same-data"),
        Case("dp=2,zero=2", corrupt="seed"),
        # Context parallelism; the wrong run attends only to its own tokens (no ring).
        Case("cp=2"),
        Case("cp=2", corrupt="cp-local"),
    ],
    4: [
        Case("dp=2,tp=2,mbs=2"),
        Case("dp=2,zero=3,tp=2,mbs=2"),
        Case("pp=2,tp=2,mbs=2"),
        Case("pp=2,dp=2,zero=1"),
        Case("pp=2,dp=2,zero=3"),
        Case("dp=4,zero=3,shard=2"),
        Case("dp=2,zero=3,tp=2,mbs=2,ac=full"),
        Case("pp=2,dp=2,zero=1,ac=selective"),
        Case("dp=2,zero=1,tp=2,sp=off,mbs=2"),
        # cp with ZeRO-3 peaks inside the ring attention's backward of the last block but one
        # (cost/memory.py's "ring" moment)
        Case("cp=2,dp=2,zero=3"),
        Case("cp=2,dp=2,zero=1"),
        Case("cp=2,tp=2,mbs=4"),
        Case("cp=2,pp=2"),
    ],
    8: [Case("dp=2,tp=2,pp=2"), Case("dp=2,zero=3,tp=2,pp=2,vpp=2,schedule=interleaved-1f1b,ac=selective")],
}

# Other models: a tied model (one tensor for embedding and head), Qwen3's features (q/k/v biases,
# q/k norms, head_dim 24 != hidden/heads, rope theta 1e6, eps 1e-6), parity only; and a mixture of
# experts under expert parallelism (alone, with ZeRO 1 and 3, with ZeRO-3 over the 2 ranks left
# beside ep=2, with TP and SP, with PP, and with context parallelism: ep=4 carved from
# dp_shard x cp = 4 x 2, so each EP group holds both cp ranks of two sequences' shards and the
# experts are ZeRO-3 sharded over the 2 ranks left), one of them deliberately wrong. The mixture of
# experts' layouts are also measured (tests/test_measure.py, in the launch of their world size),
# but those marked measured=False.
MODEL_CASES: dict[int, list[Case]] = {
    2: [
        Case("dp=2,zero=0", "tiny-tied"),
        Case("tp=2,sp=on,mbs=4", "tiny-tied"),
        Case("tp=2,sp=on,mbs=4", "tiny-qwen3"),
        Case("pp=2,schedule=1f1b", "tiny-qwen3"),
        Case("dp=2,ep=2", "tiny-moe"),
        Case("dp=2,zero=1,ep=2", "tiny-moe"),
        # the start of the backward and the end of the forward are predicted 0.6% apart; the workers
        # record that the peak fell in a backward, so both ranks are compared there (2026-12-03:
        # params -0.1%, grads -4.3%, activations +2.9% and +6.6%)
        Case("dp=2,zero=3,ep=2", "tiny-moe"),
        Case("dp=2,ep=2", "tiny-moe", corrupt="same-data"),
        # Gemma 3's and OLMo 2's blocks (catalog tiny-gemma3, tiny-olmo2), parity only
        Case("tp=2,sp=on,mbs=4", "tiny-gemma3"),
        Case("pp=2,schedule=1f1b,ac=selective", "tiny-gemma3"),
        Case("dp=2,zero=3,ac=full", "tiny-olmo2"),
        Case("pp=2,schedule=1f1b", "tiny-olmo2"),
    ],
    4: [
        Case("dp=2,zero=3,tp=2,mbs=2", "tiny-tied"),
        Case("dp=2,zero=3,tp=2,mbs=2", "tiny-gemma3"),
        Case("dp=4,zero=3,ep=2", "tiny-moe"),
        Case("dp=2,ep=2,tp=2,mbs=2", "tiny-moe"),
        Case("pp=2,dp=2,ep=2", "tiny-moe"),
    ],
    # ep with cp: the peak falls inside the ring attention's backward of the last block (a MoE
    # block's tensors outweigh its weights) or, on a rank or step whose routing keeps more, inside
    # the last block's shared expert's backward; the workers record which (2026-12-04: params
    # -1.2%, grads -0.5%, optimizer -1.0..+0.3%, activations -3.1..+6.8%; docs/runtime.md)
    8: [Case("dp=4,zero=3,cp=2,ep=4", "tiny-moe")],
}
PARITY_CASES: dict[int, list[Case]] = {w: cases + MODEL_CASES.get(w, []) for w, cases in CASES.items()}
