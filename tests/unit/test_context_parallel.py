"""Context parallelism's sequence split (single process; the ring itself is checked by the parity suite)."""

import torch

from meshwise.runtime.context_parallel import chunk_ids, positions, shard_sequence


def test_load_balanced_split_covers_every_token_once_with_its_position() -> None:
    """cp rank i holds chunks i and 2cp-1-i of 2cp; the parts of all ranks are a permutation of the
    sequence, and positions() names each local token's place in it."""
    seq = torch.arange(48).view(1, 48)
    for cp in (1, 2, 3, 4):
        parts = [shard_sequence(seq, cp, r) for r in range(cp)]
        assert sorted(torch.cat(parts, dim=1).flatten().tolist()) == list(range(48))
        for r, part in enumerate(parts):
            assert part.shape == (1, 48 // cp)
            if cp > 1:
                assert torch.equal(part.flatten(), positions(48 // cp, cp, r))
                a, b = chunk_ids(cp, r)
                assert a + b == 2 * cp - 1  # every rank has the same causal work


def test_moe_balance_loss_is_exact_over_cp_shards(monkeypatch) -> None:
    """Under cp each rank computes the sequence-wise load-balancing loss from the routing counts summed
    over the cp ranks (an all-reduce, emulated here) and its own tokens' probabilities: the mean over
    the cp ranks equals the whole sequence's loss, value and router gradient; without the counts'
    sum (each rank alone) it does not."""
    from meshwise.runtime import moe as moe_mod
    from meshwise.spec import load_model

    cp = 2
    block = moe_mod.MoE(load_model("tiny-moe"), None)
    torch.nn.init.normal_(block.router.weight, std=0.5)
    x = torch.randn(3, 16, block.router.in_features, generator=torch.Generator().manual_seed(0))

    def aux(tokens: torch.Tensor) -> torch.Tensor:
        probs = block.router(tokens).float().softmax(-1)
        return block._aux_loss(probs, probs.topk(block.top_k, dim=-1)[1])

    def grad_of(loss: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(loss, block.router.weight)[0]

    whole = aux(x)
    with torch.no_grad():
        chosen = block.router(x).float().softmax(-1).topk(block.top_k, dim=-1)[1]
        hits = torch.zeros(3, 4).scatter_add_(1, chosen.reshape(3, -1), torch.ones(3, 16 * block.top_k))
    alone = [aux(shard_sequence(x, cp, c)) for c in range(cp)]
    block.cp_group = object()
    monkeypatch.setattr(moe_mod.dist, "all_reduce", lambda t, group=None: t.copy_(hits))
    monkeypatch.setattr(moe_mod.dist, "get_world_size", lambda group=None: cp)
    parts = [aux(shard_sequence(x, cp, c)) for c in range(cp)]
    assert torch.allclose(sum(parts) / cp, whole, rtol=1e-6)
    assert torch.allclose(sum(grad_of(p) for p in parts) / cp, grad_of(whole), rtol=1e-5, atol=1e-9)
    assert not torch.allclose(sum(alone) / cp, whole, rtol=1e-3)
