"""Count the bytes Megatron-Core's unfused cross-entropy moves per logit, forward and backward, read off the
installed megatron-core (the oracle of --runtime megatron) by running it on CPU.

``GPTModel.compute_language_model_loss`` without ``--cross-entropy-loss-fusion`` (Megatron-LM's default)
calls ``tensor_parallel.vocab_parallel_cross_entropy``, which upcasts the bf16 logits to float32 and runs
max, an in-place subtract, ``exp(out=)``, sum and an in-place divide, then in backward an in-place multiply;
autograd casts the float32 gradient back to bf16. Every aten op it dispatches on a tensor with a vocabulary
dimension is counted as the bytes it reads plus those it writes (an in-place op, or ``out=``, reads its
tensor once and writes it once); the gathers of one logit per token (``index``, ``index_put_``) move a token's worth, not
a vocabulary's, and are left out. The TP group is stood in for by a group of one (no collective).

cost/kernels.py's ``PASSES["megatron"]["loss_bytes"]`` is the sum (tests/unit/test_kernels_megatron_loss.py
runs this script and compares).

    python benchmarks/megatron_loss_bytes.py      # one JSON object: forward and backward bytes per logit
"""

from __future__ import annotations

import json
import warnings

VIEWS = {
    "view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "detach", "slice", "select", "unsqueeze",
    "alias", "lift_fresh", "view_as", "_local_scalar_dense", "index", "index_put_", "clone", "arange",
}  # fmt: skip


def _counter(torch, vocab: int):
    from torch.utils._python_dispatch import TorchDispatchMode

    def nbytes(x) -> int:
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) and x.shape[-1:] == (vocab,) else 0

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.__name__.split(".")[0]
            if name in VIEWS:
                return out
            written = sum(nbytes(o) for o in (out if isinstance(out, list | tuple) else [out]))
            read = sum(nbytes(a) for a in args) + sum(nbytes(v) for k, v in kwargs.items() if k != "out")
            self.bytes += read + written
            return out

    return Count


def count(seq: int = 64, batch: int = 2, vocab: int = 4096) -> dict:
    """{forward, backward}: bytes per logit of megatron-core's vocab_parallel_cross_entropy on bf16 logits."""
    warnings.filterwarnings("ignore")
    import megatron.core.tensor_parallel.cross_entropy as ce
    import torch

    ce.get_tensor_model_parallel_group = lambda: None
    ce.get_tensor_model_parallel_rank = lambda: 0
    ce.get_tensor_model_parallel_world_size = lambda: 1
    torch.distributed.all_reduce = lambda *a, **k: None
    Count = _counter(torch, vocab)
    logits = torch.randn(seq, batch, vocab, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (seq, batch))
    with Count() as forward:
        loss = ce.vocab_parallel_cross_entropy(logits.float(), target)
    with Count() as backward:
        loss.sum().backward()
    n = seq * batch * vocab
    return {"forward": forward.bytes / n, "backward": backward.bytes / n}


if __name__ == "__main__":
    print(json.dumps(count()))
