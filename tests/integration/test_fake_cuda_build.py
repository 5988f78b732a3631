"""The fake CUDA device for torch's CPU build (meshwise.measure.fake_cuda): with it loaded before
torch, a backward runs on FakeTensorMode ``cuda`` tensors, which the CPU build alone aborts on.
``meshwise verify`` traces GPU profiles with it
(tests/integration/test_verify_traces.py::test_the_gpu_precision_path_ran)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshwise.measure import fake_cuda

PROBE = """
from meshwise.measure import fake_cuda
assert fake_cuda.load_if_built()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
assert fake_cuda.active()
with FakeTensorMode():
    w = torch.randn(64, 32, device="cuda", requires_grad=True)
    x = torch.randn(8, 64, device="cuda")
    y = (x.to(torch.bfloat16) @ w.to(torch.bfloat16)).float().square().sum()
    y.backward()
    print(w.grad.device, w.grad.dtype, tuple(w.grad.shape))
# leave as verify's trace processes do (os._exit: no C++ static destructors): at interpreter exit the
# autograd engine's thread for the fake device sometimes aborts ("terminate called without an active
# exception"), after the work is done
import os, sys
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.skipif(fake_cuda.compiler() is None, reason="no C++ compiler (scripts/test.sh installs g++ as root)")
def test_a_backward_runs_on_fake_cuda_tensors() -> None:
    fake_cuda.build()
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cuda:0", "torch.float32", "(64,", "32)"]


def test_without_the_library_the_cpu_build_cannot() -> None:
    """The test above can fail: the same backward without the library dies (the CPU build has no
    CUDA device guard)."""
    probe = PROBE.replace("assert fake_cuda.load_if_built()", "").replace("assert fake_cuda.active()", "")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
