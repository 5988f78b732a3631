"""A MoE block timed alone (measure/moe_parts.py): every part it runs reads a time, on one process."""

import dataclasses

from meshwise.cost.host_moe import part_key
from meshwise.measure import moe_parts
from meshwise.spec import load_model
from meshwise.spec.host_keys import MOE_PART_SECONDS


def test_the_block_alone_times_each_part_it_runs():
    spec = dataclasses.replace(load_model("tiny-moe"), experts=8)
    block = moe_parts.build_block(part_key(spec, 32, 1))
    assert block.training and block.experts.w1.shape[0] == 8 and block.shared is not None
    seconds = moe_parts.time_block(block, 2, 32, runs=3)
    assert set(seconds) == set(MOE_PART_SECONDS)
    assert all(seconds[k] > 0 for k in ("router_s", "permute_s", "experts_s", "shared_s", "forward_s"))
    assert seconds["dispatch_host_s"] == 0  # ep = 1: no all-to-all
    # forward_s (forward only) against the parts (forward and backward) is a wall-clock ratio: it is
    # read in benchmarks/moe_parts_cpu.py, not asserted here (it failed once on a loaded host).
