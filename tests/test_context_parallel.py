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
