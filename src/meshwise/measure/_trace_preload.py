"""What verify's trace processes import first (their forkserver's preload, ``verify.trace_rank``):
the fake CUDA device when it is built (:mod:`meshwise.measure.fake_cuda`; it must be loaded before
torch), then torch and the trace. Only the forkserver and its children import this module."""

import sys

from meshwise.measure import fake_cuda

if "torch" not in sys.modules:  # else too late: the trace takes the cpu device (verify_worker.trace_device)
    fake_cuda.load_if_built()

from meshwise.measure import verify_worker  # noqa: E402,F401  (torch, meshwise's runtime: imported once, forked per trace)
