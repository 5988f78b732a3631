"""A fake CUDA device for torch's CPU build, so that ``meshwise verify`` traces a GPU profile's
rank on fake ``cuda`` tensors, backward included (``fake_cuda.cpp`` says what it registers and why).

torch 2.13's CPU build runs a forward on ``FakeTensorMode`` cuda tensors but not its backward: the
autograd engine asks for CUDA's device guard (there is none: the process aborts) and then for the
accelerator's current stream (``InputBuffer::add`` -> ``at::accelerator::getCurrentStream``, which
raises "Cannot access accelerator device when none is available" because
``getCUDAHooks().isBuilt()`` is false). A small C++ library registers both; it is compiled once
with the machine's C++ compiler (g++) against the installed torch and kept in the user's cache.

Containment. The library must be loaded before torch is imported (``getCUDAHooks()`` keeps the
hooks it first finds, and importing torch asks for them), and its registrations last for the
process. It is loaded only by verify's forkserver (``_trace_preload``), whose children are the
trace processes; the process that runs verify, and anything that trains, never loads it. Inside
a trace, :func:`python_cuda` stands in for ``torch.cuda``'s Python side (streams, events, device,
RNG state) and registers CUDA kernels for the few ops that would otherwise decompose on cuda.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshwise.errors import MeshwiseError

SOURCE = Path(__file__).with_name("fake_cuda.cpp")


def _torch_dir() -> Path:
    """The installed torch package's directory, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    return Path(list(spec.submodule_search_locations)[0])


def library_path() -> Path:
    """Where the compiled library is cached: one file per (source, torch version and location, Python)."""
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"{importlib.metadata.version('torch')}|{_torch_dir()}|{sys.version}".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "meshwise"
    return cache / f"fake_cuda-{key.hexdigest()[:16]}.so"


def compiler() -> str | None:
    """The C++ compiler the library is built with: $CXX, else g++ (None when there is none)."""
    return shutil.which(os.environ.get("CXX") or "g++")


def build() -> Path:
    """Compile the library once (a few seconds) and return its path; MeshwiseError (one line) when
    there is no C++ compiler or the compile fails. Imports torch (its headers' paths and C++ ABI)."""
    path = library_path()
    if path.exists():
        return path
    cxx = compiler()
    if cxx is None:
        raise MeshwiseError(
            "verify: tracing a GPU profile on this CPU build of torch needs a C++ compiler (g++) "
            "to build its fake CUDA device; install it (Debian: apt-get install g++) or set $CXX"
        )
    from torch.utils import cpp_extension  # torch: the fake CUDA device is loaded before torch is imported

    # torch: the fake CUDA device is loaded before torch is imported
    from meshwise.runtime._torch_private import cxx11_abi

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    lib = _torch_dir() / "lib"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        cxx,
        "-shared",
        "-fPIC",
        "-O1",
        "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi()}",
        *includes,
        str(SOURCE),
        f"-L{lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{lib}",
        "-o",
        str(tmp),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MeshwiseError(f"verify: compiling the fake CUDA device ({SOURCE.name}) with {cxx} failed: {last}")
    os.replace(tmp, path)  # atomic: a concurrent build writes the same bytes
    return path


def load_if_built() -> bool:
    """Load the library into this process if it is built (before torch is imported); whether it is loaded."""
    path = library_path()
    if not path.exists():
        return False
    if "torch" in sys.modules:
        raise RuntimeError("meshwise.measure.fake_cuda: load the fake CUDA device before torch is imported")
    ctypes.CDLL(str(path))
    return True


def active() -> bool:
    """Whether this process has the fake CUDA device (torch's accelerator is cuda on a CPU build)."""
    import torch  # torch: the fake CUDA device is loaded before torch is imported

    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "cuda"


class _Event:
    """A CUDA event on a device with no work in flight: recorded at once, always complete."""

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end) -> float:
        return 0.0


class _Stream:
    """A CUDA stream on a device with no work in flight. ``record_event`` returns an event, as
    torch.cuda.Stream's does (torch.cpu.Stream's returns None, and FSDP2 on a non-CPU device requires
    the event of its all-reduce: "Expected all_reduce_event to be set for non-CPU device")."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> _Event:
        event = event or _Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = _Stream()


@contextmanager
def _use_stream(stream) -> Iterator[None]:
    yield


# torch.cuda's Python functions the traced step calls (FSDP2's device handle: its streams, events and
# the current device; the pipeline schedules' and checkpointing's fork_rng: the RNG state), answered
# as on a device with no work in flight: one default stream, events complete at once, the current
# device is 0, one device exists, and its RNG state is empty (fake tensors draw nothing).
_PYTHON_CUDA = (
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "stream",
    "synchronize",
    "current_device",
    "device_count",
    "set_device",
    "get_rng_state",
    "set_rng_state",
)


_KERNELS: list = []  # the torch.library.Library holding the CUDA registrations (kept alive)


def _no_kernel(*args, **kwargs):
    raise RuntimeError("meshwise fake CUDA device: no kernels (only fake tensors run on it)")


def _register_cuda_kernels() -> None:
    """A CUDA kernel (never run: fake tensors stop at the Python key above it) for each aten op with
    a CPU kernel, no CUDA one and a CompositeImplicitAutograd decomposition (torch 2.13:
    ``silu_backward``, ``mish_backward``, ``native_channel_shuffle``). Without a backend kernel the
    dispatcher runs the decomposition for cuda tensors: SiLU's backward as sigmoid, 1 - sigmoid and
    four more full-size temporaries, where a GPU runs one kernel (as the CPU does)."""
    if _KERNELS:
        return
    import torch  # torch: the fake CUDA device is loaded before torch is imported

    # torch: the fake CUDA device is loaded before torch is imported
    from meshwise.runtime._torch_private import aten_op_names, has_kernel

    lib = torch.library.Library("aten", "IMPL")
    for name in aten_op_names():
        if (
            name.startswith("aten::")
            and has_kernel(name, "CompositeImplicitAutograd")
            and has_kernel(name, "CPU")
            and not has_kernel(name, "CUDA")
        ):
            lib.impl(name.removeprefix("aten::"), _no_kernel, "CUDA")
    _KERNELS.append(lib)


@contextmanager
def python_cuda() -> Iterator[None]:
    """While open, ``torch.cuda``'s streams, events, device queries and RNG state are the fake device's (see above);
    the CPU build's own raise "Torch not compiled with CUDA enabled". ``is_available()`` stays False."""
    import torch  # torch: the fake CUDA device is loaded before torch is imported

    _register_cuda_kernels()
    saved = {name: getattr(torch.cuda, name) for name in _PYTHON_CUDA}
    fake = dict(
        Stream=_Stream,
        Event=_Event,
        current_stream=lambda device=None: _DEFAULT_STREAM,
        default_stream=lambda device=None: _DEFAULT_STREAM,
        stream=_use_stream,
        synchronize=lambda device=None: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        set_device=lambda device: None,
        get_rng_state=lambda device="cuda": torch.empty(0, dtype=torch.uint8),
        set_rng_state=lambda state, device="cuda": None,
    )
    for name, value in fake.items():
        setattr(torch.cuda, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
