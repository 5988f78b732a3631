"""``meshwise calibrate`` on a CUDA device (measure/calibrate_gpu.py, measure/gpu_bench.py) without one:
its benchmarks run on meta tensors here and on the fake CUDA device (measure/fake_cuda.py) in a
subprocess, answered by the catalog H100's own time model (tests/_synthetic_gpu.py); fitting those
times must give the catalog's constants back, and ``plan --gpu FILE`` must then plan as with ``h100``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests._cli import meshwise_here
from tests._synthetic_gpu import H100, CatalogTimer

from meshwise.cost import kernels
from meshwise.measure import calibrate_gpu, fake_cuda, gpu_bench
from meshwise.spec import load_cluster, load_model
from meshwise.spec.gpu_keys import ATTENTION_FIELDS

ROOT = Path(__file__).resolve().parents[2]
FAKE_H100 = ("NVIDIA H100 80GB HBM3", 132, 85_000_000_000, True, 1)


@pytest.mark.parametrize(
    "name, entry",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_device_name_finds_its_catalog_entry(name, entry):
    found = calibrate_gpu.catalog_name(name)
    assert (found and load_cluster(found, 1, 1).accelerator.name) == entry


def test_the_gemm_shapes_are_the_plans():
    """The linears of one block and the head hold the model's matmul parameters (T x P per
    direction); each is timed forward, input- and weight-gradient; TP divides N or K."""
    model = load_model("llama3-8b")
    linears = calibrate_gpu.plan_linears(model, 1)
    assert sum(n * k for n, k in linears) == model.attention_params + model.mlp_params + model.hidden * model.vocab
    shapes = set(calibrate_gpu.plan_gemm_shapes(model, 4096, 1))
    assert all({(1, 4096, n, k), (1, 4096, k, n), (1, k, n, 4096)} <= shapes for n, k in linears)
    assert calibrate_gpu.plan_linears(model, 2)[2:4] == [(14336, 4096), (4096, 7168)]  # MLP in (gate + up), out


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> tuple[dict, Path, dict]:
    """The calibration's parts on meta tensors, timed by the catalog H100's model; the profile written."""
    tmp_path = tmp_path_factory.mktemp("calibrated")
    device = gpu_bench.Device(FAKE_H100[0], "meta", *FAKE_H100[1:])
    samples = calibrate_gpu.measure_parts(
        load_model("llama3-8b"), 4096, device, calibrate_gpu.FULL, CatalogTimer(), lambda line: None
    )
    table = calibrate_gpu.profile_table(device, samples, None, "llama3-8b at 4096 tokens")
    out = tmp_path / "h100-measured.toml"
    out.write_text(calibrate_gpu.format_profile(table))
    return table, out, samples


def test_the_fits_give_the_catalog_back(calibrated):
    table, _, _ = calibrated
    efficiency, k_half = kernels.gemm_row(H100, "bf16")
    assert table["gemm.bf16"]["efficiency"] == pytest.approx(efficiency, rel=0.01)
    assert table["gemm.bf16"]["k_half"] == pytest.approx(k_half, abs=3)
    assert table["kernel_floor_s"] == pytest.approx(H100.kernel_floor_s, rel=0.01)
    assert (table["gemm_tile_m"], table["gemm_tile_n"]) == (H100.gemm_tile_m, H100.gemm_tile_n)
    row = {r[0]: r[2:] for r in H100.attention}["meshwise"]
    got = [table["attention.meshwise"][f] for f in ATTENTION_FIELDS]
    assert got == pytest.approx(list(row), rel=0.02)
    assert table["hbm_efficiency"] == pytest.approx(H100.hbm_efficiency, rel=1e-6)
    assert table["sustained_clock"] == pytest.approx(H100.sustained_clock, rel=1e-6)
    assert "collectives not measured (they need >= 2 GPUs)" in table["source"]
    assert (table["intra_bytes_per_s"], table["intra_latency_s"]) == (300e9, 8.17e-6)  # the catalog's kept


def _step_s(profile: str, precision: str, cwd: Path) -> float:
    done = meshwise_here(
        "plan",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--gpu",
        profile,
        "--layout",
        "dp=8,zero=3",
        "--precision",
        precision,
        "--json",
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["candidates"][0]["time"]["step_s"]


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp8"])
def test_plan_reads_the_profile_as_the_catalog(calibrated, tmp_path, precision):
    """A profile fitted on the catalog model's own times plans the catalog's step time (fp8's GEMM fit
    leaves 2% on its shapes: the step within 1.5%)."""
    _, out, _ = calibrated
    assert _step_s(str(out), precision, tmp_path) == pytest.approx(_step_s("h100", precision, tmp_path), rel=0.015)


def test_the_link_fit_gives_the_catalog_link_back():
    """NCCL rows timed by the catalog H100's NVLink (cost/comm.py) fit back to it within LINK_BOUNDS."""
    from meshwise.cost import comm

    link = load_cluster("h100", 8).intra
    rows = [
        [kind, n, size, comm.collective_seconds(kind, n, size, link)]
        for kind in ("all_reduce", "all_gather")
        for n in (2, 8)
        for size in (4 << 10, 1 << 20, 64 << 20, 256 << 20)
    ]
    fit = calibrate_gpu.link_fields(rows)
    assert fit["bytes_per_s"] == pytest.approx(link.bytes_per_s, rel=0.01)
    assert fit["latency_s"] == pytest.approx(link.latency_s, rel=0.02)


def test_a_device_the_catalog_lacks_is_profiled_from_its_own_figures(calibrated, tmp_path):
    """No catalog entry: its best GEMM rate is the peak, its copy the HBM, a PCIe link assumed; plan reads it."""
    _, _, samples = calibrated
    device = gpu_bench.Device("Acme Tensor Card 9", "meta", 100, 48_000_000_000, False, 1)
    table = calibrate_gpu.profile_table(device, samples, None, "llama3-8b")
    best = max(2.0 * b * m * n * k / t for b, m, n, k, t in samples["gemm_bf16"])
    assert table["name"] == "acme-tensor-card-9-calibrated" and table["sm_count"] == 100
    assert table["peak_bf16_flops_per_s"] == pytest.approx(best) and "peak_fp8_flops_per_s" not in table
    assert table["hbm_bytes_per_s"] == pytest.approx(samples["copy_bytes_per_s"]) and table["hbm_efficiency"] == 1.0
    assert table["intra_bytes_per_s"] == 25e9 and "not in the catalog" in table["source"]
    out = tmp_path / "acme.toml"
    out.write_text(calibrate_gpu.format_profile(table))
    assert _step_s(str(out), "bf16-mixed", tmp_path) > 0
    done = meshwise_here(
        "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", str(out), "--precision", "fp8", cwd=tmp_path
    )
    assert done.returncode == 2 and "has no float8 tensor cores" in done.stderr  # refused, as the catalog's a100


def test_measure_refuses_a_precision_the_device_does_not_train(tmp_path):
    done = meshwise_here(
        "measure", "--nproc-per-node", "1", "--model", "tiny", "--precision", "bf16-mixed", "--gpu", "cpu", cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "--precision bf16-mixed: the runtime trains in fp32 on cpu" in done.stderr


def test_cuda_without_a_device_is_refused_in_one_line(tmp_path):
    done = meshwise_here("calibrate", "--device", "cuda", "--out", str(tmp_path / "p.toml"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--device cuda: torch sees no CUDA device" in done.stderr
    assert not (tmp_path / "p.toml").exists()


PROBE = """
import json, os, sys
from meshwise.measure import fake_cuda
assert fake_cuda.load_if_built()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from meshwise.measure import calibrate_gpu, gpu_bench
from meshwise.spec import load_model
from tests._synthetic_gpu import CatalogTimer

device = gpu_bench.Device("NVIDIA H100 80GB HBM3", "cuda", 132, 85_000_000_000, True, 1)
seen = []
class Seen(CatalogTimer):
    def __call__(self, fn, key):
        out = fn()
        outs = out if isinstance(out, (tuple, list)) else [out]
        seen.append([key[0], key[1], [str(t.device) for t in outs], [str(t.dtype) for t in outs]])
        return super().__call__(lambda: None, key)
with fake_cuda.python_cuda(), FakeTensorMode():
    samples = calibrate_gpu.measure_parts(load_model("llama3-8b"), 4096, device, calibrate_gpu.FULL, Seen(), print)
table = calibrate_gpu.profile_table(device, samples, None, "llama3-8b")
print(json.dumps({"seen": seen, "efficiency": table["gemm.bf16"]["efficiency"]}))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.skipif(fake_cuda.compiler() is None, reason="no C++ compiler (scripts/test.sh installs g++ as root)")
def test_the_cuda_code_paths_run_on_the_fake_device():
    """bf16, fp8 (torch._scaled_mm), grouped (torch._grouped_mm) GEMMs and SDPA forward and backward
    dispatch on ``cuda`` tensors and give bf16 results on the device."""
    fake_cuda.build()
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kinds = {(k, what) for k, what, _, _ in result["seen"]}
    assert {
        ("gemm", "bf16"),
        ("gemm", "fp8"),
        ("attention", "forward"),
        ("attention", "backward"),
        ("copy", 1 << 30),
    } <= kinds
    assert all(
        set(devices) == {"cuda:0"} and set(dtypes) == {"torch.bfloat16"}
        for k, _, devices, dtypes in result["seen"]
        if k in ("gemm", "attention")
    )
    assert result["efficiency"] == pytest.approx(kernels.gemm_row(H100, "bf16")[0], rel=0.01)


def test_a_cuda_record_puts_the_allocator_beside_the_plan():
    """measure's worker records the CUDA allocator's peaks on a GPU; compare puts each beside the plan's peak."""
    from tests.unit.test_measure_report import synthetic_records

    from meshwise.measure.compare import rows_for
    from meshwise.spec import TrainSpec

    record = synthetic_records("dp=2")[0] | {"cuda_peak_allocated": 2_000_000, "cuda_peak_reserved": 4_000_000}
    rows = {
        r.figure: r
        for r in rows_for(record, load_model("tiny"), load_cluster("cpu", 2), TrainSpec(8, 64, precision="fp32"))
    }
    assert rows["memory.cuda_peak_allocated"].measured == 2_000_000
    assert rows["memory.cuda_peak_reserved"].measured == 4_000_000
    assert rows["memory.cuda_peak_allocated"].predicted == rows["memory.total"].predicted
    cpu = {
        r.figure
        for r in rows_for(
            synthetic_records("dp=2")[0], load_model("tiny"), load_cluster("cpu", 2), TrainSpec(8, 64, precision="fp32")
        )
    }
    assert not any("cuda" in f for f in cpu)
