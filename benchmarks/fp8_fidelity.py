"""Published float8 runs against the plan: the float8 / bf16 throughput ratio of the same layout on the
same cluster, published beside each other (so compile and the stack's other gains cancel), against the
ratio meshwise predicts. No constant is fitted here: cost/fp8.py's come from component benchmarks.

Sources (docs/sources.md): pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Tables 1, 3:
FSDP + compile with and without Float8, tensorwise), benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md
(vanilla TP rows), torchtitan/components/quantization/mxfp8.md (8 B200, Llama 3 8B assumed).

    python benchmarks/fp8_fidelity.py
"""

from __future__ import annotations

from meshwise.cost.estimate import estimate
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model

# (id, model, gpu, gpus, layout, seq, global batch, precision, published float8 / bf16 tokens/s)
RUNS = (
    ("torchtitan-2412-8b-8", "llama3-8b", "h100-hbm2e", 8, "dp=8,zero=3,mbs=2,ac=selective", 8192, 16, "fp8",
     8532 / 6667),
    ("torchtitan-2412-8b-128", "llama3-8b", "h100-hbm2e", 128, "dp=128,zero=3,mbs=2,ac=selective", 8192, 256, "fp8",
     8380 / 6514),
    ("torchtitan-2506-70b-256-tensorwise", "llama3-70b", "h100-hbm2e", 256, "dp=32,zero=3,tp=8,sp=on,mbs=16,ac=full",
     8192, 512, "fp8", 809.8 / 597.3),
    ("torchtitan-2506-8b-64-tensorwise", "llama3-8b", "h100-hbm2e", 64, "dp=8,zero=3,tp=8,sp=on,mbs=12,ac=selective",
     8192, 96, "fp8", 5078.1 / 4378),
    ("torchtitan-mxfp8-b200-8-tensorwise", "llama3-8b", "b200", 8, "dp=8,zero=3,mbs=1,ac=selective", 8192, 8, "fp8",
     10417.0 / 8307.5),
    ("torchtitan-mxfp8-b200-8-mxfp8", "llama3-8b", "b200", 8, "dp=8,zero=3,mbs=1,ac=selective", 8192, 8, "mxfp8",
     9969.0 / 8307.5),
)


def predicted_ratio(model: str, gpu: str, gpus: int, layout: str, seq: int, batch: int, precision: str) -> float:
    m, c, lay = load_model(model), load_cluster(gpu, gpus), parse(layout, gpus)
    policy = "every-other-matmul"
    base = estimate(m, c, TrainSpec(batch, seq, selective_policy=policy), lay)
    fp8 = estimate(m, c, TrainSpec(batch, seq, precision=precision, selective_policy=policy), lay)
    return fp8.tokens_per_s / base.tokens_per_s


def errors() -> list[tuple[str, float, float, float]]:
    out = []
    for rid, model, gpu, gpus, layout, seq, batch, precision, published in RUNS:
        pred = predicted_ratio(model, gpu, gpus, layout, seq, batch, precision)
        out.append((rid, published, pred, pred / published - 1))
    return out


if __name__ == "__main__":
    rows = errors()
    for rid, pub, pred, err in rows:
        print(f"{rid:40s} published {pub:.3f}  predicted {pred:.3f}  {err:+.1%}")
    abs_err = [abs(r[3]) for r in rows]
    print(f"mean |error| {sum(abs_err) / len(abs_err):.1%}, worst {max(abs_err):.1%}")
