"""A mixture of experts on a CPU rank (cost/host_moe.py): its operator counts are the runtime's own,
its parts grow with what the runtime runs, and the plan's step carries them."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from meshwise.cost import host, host_moe
from meshwise.cost.estimate import estimate
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counted(module: torch.nn.Module, hidden: int) -> tuple[int, int]:
    x = torch.randn(2, 16, hidden, requires_grad=True)
    with _Count() as fwd:
        y = module(x)
    grad = torch.ones_like(y)
    with _Count() as bwd:
        y.backward(grad)
    return fwd.ops, bwd.ops


def _moe(experts: int):
    from meshwise.runtime.moe import MoE

    spec = dataclasses.replace(load_model("tiny-moe"), experts=experts, shared_ffn_hidden=0, shared_expert_gate=False)
    torch.manual_seed(0)
    block = MoE(spec, None)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return block, spec


@pytest.mark.parametrize("experts", [4, 8])
def test_operator_counts_are_the_runtimes(experts):
    """The block's operators, forward and backward, are the parts' counts: router, permute, the
    loop's fixed ones and EXPERT_OPS per expert (ep = 1)."""
    block, spec = _moe(experts)
    counted = _counted(block, spec.hidden)
    for i in range(2):
        parts = host_moe.ROUTER_OPS[i] + host_moe.PERMUTE_OPS[i] + host_moe.EXPERTS_OPS[i]
        assert counted[i] == parts + experts * host_moe.EXPERT_OPS[i]


def test_dense_mlp_count_is_the_runtimes():
    from meshwise.runtime.model import MLP

    spec = load_model("tiny")
    assert _counted(MLP(spec), spec.hidden) == host_moe.MLP_OPS


def test_part_timing_changes_nothing_and_times_every_part():
    """With the clock installed the block gives the same output and gradients, and each part it runs
    reads a positive time."""
    from meshwise.runtime.moe import timed_parts

    block, spec = _moe(8)
    x = torch.randn(1, 32, spec.hidden, requires_grad=True)
    plain = block(x)
    plain.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    with timed_parts() as clock:
        timed = block(x)
        timed.sum().backward()
    assert torch.equal(plain, timed) and torch.equal(grad, x.grad)
    assert all(clock.seconds[p] > 0 for p in ("router_s", "permute_s", "experts_s"))
    assert clock.seconds["shared_s"] == 0 and clock.seconds["dispatch_combine_s"] == 0


def test_parameter_tensors_of_a_moe_model_are_the_runtimes():
    from meshwise.runtime.model import build_model

    for spec in (load_model("tiny-moe"), dataclasses.replace(load_model("tiny-moe"), experts=8, shared_ffn_hidden=0)):
        params = list(build_model(spec, seed=0).parameters())
        assert host.parameter_tensors(spec, spec.layers, True, True) == len(params)


def test_parts_follow_the_experts_and_the_plan_carries_them():
    """More local experts cost more loop operators; EP halves them; estimate's CPU split holds the
    parts and the all-to-alls, and the step grows with the MoE blocks' parts."""
    accel = load_cluster("cpu", 2, 2).accelerator
    spec = dataclasses.replace(load_model("tiny-moe"), experts=8)
    whole, halved = host_moe.cpu_moe_parts(spec, accel, 128, 1), host_moe.cpu_moe_parts(spec, accel, 128, 2)
    assert whole.experts_s > halved.experts_s > 0 and whole.router_s == halved.router_s
    assert whole.forward_s < whole.total_s
    e = estimate(spec, load_cluster("cpu", 2, 2), TrainSpec(4, 128, precision="fp32"), parse("dp=2,ep=2,mbs=1", 2))
    split = e.time.as_json()["moe_block_s"]
    assert set(split) == {"router_s", "permute_s", "experts_s", "shared_s", "dispatch_combine_s"}
    assert all(v > 0 for v in split.values())
    assert split["experts_s"] == pytest.approx(halved.experts_s * spec.moe_layers * 2)  # 2 micro-batches


def _timed_row(spec, tokens: float, ep: int, seconds: tuple[float, ...]) -> tuple[float, ...]:
    return (*host_moe.part_key(spec, tokens, ep), *seconds)


def test_a_timed_row_replaces_the_priced_parts_at_its_shape_only():
    """A profile's ``moe_part_table`` row (measure/moe_parts.py) gives the parts at its shape; another
    token count or EP group is priced; the plan's dispatch / combine carries the row's host work
    beside the all-to-alls, and the step grows by the row's parts less the priced ones."""
    cluster = load_cluster("cpu", 2, 2)
    spec = dataclasses.replace(load_model("tiny-moe"), experts=8)
    seconds = (1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3)  # router, permute, experts, shared, dispatch host, forward
    accel = dataclasses.replace(cluster.accelerator, moe_part_table=(_timed_row(spec, 128, 2, seconds),))
    timed = host_moe.cpu_moe_parts(spec, accel, 128, 2)
    assert (timed.router_s, timed.permute_s, timed.experts_s, timed.shared_s) == seconds[:4]
    assert (timed.dispatch_host_s, timed.forward_s) == seconds[4:]
    assert host_moe.cpu_moe_parts(spec, accel, 64, 2) == host_moe.cpu_moe_parts(spec, cluster.accelerator, 64, 2)
    assert host_moe.cpu_moe_parts(spec, accel, 128, 1) == host_moe.cpu_moe_parts(spec, cluster.accelerator, 128, 1)
    train, layout = TrainSpec(4, 128, precision="fp32"), parse("dp=2,ep=2,mbs=1", 2)
    plain = estimate(spec, cluster, train, layout)
    e = estimate(spec, dataclasses.replace(cluster, accelerator=accel), train, layout)
    calls = spec.moe_layers * 2  # 2 micro-batches
    split, before = e.time.as_json()["moe_block_s"], plain.time.as_json()["moe_block_s"]
    assert split["router_s"] == pytest.approx(calls * seconds[0])
    a2a = before["dispatch_combine_s"]  # the all-to-alls, priced the same either way
    assert split["dispatch_combine_s"] == pytest.approx(a2a + calls * seconds[4])
    priced = host_moe.cpu_moe_parts(spec, cluster.accelerator, 128, 2)
    grown = calls * (sum(seconds[:5]) - priced.total_s)
    assert e.time.compute_s - plain.time.compute_s == pytest.approx(grown)


def test_a_bad_moe_part_row_is_refused_naming_the_table():
    from meshwise.errors import MeshwiseError
    from meshwise.spec.host_keys import host_fields

    spec = load_model("tiny-moe")
    good = list(_timed_row(spec, 128, 2, (1e-3,) * 6))
    assert host_fields({"moe_part_table": [good]}, "p.toml")["moe_part_table"] == (tuple(good),)
    for bad in (
        good[:-1],
        [*good[:-1], -1.0],
        [0.0, *good[1:]],
        [*good[:7], 5.0, *good[8:]],
        [*good[:9], 1.5, *good[10:]],
    ):
        with pytest.raises(MeshwiseError, match="moe_part_table"):
            host_fields({"moe_part_table": [bad]}, "p.toml")
