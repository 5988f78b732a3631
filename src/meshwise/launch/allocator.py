"""The host allocator of a CPU rank: keep freed memory for reuse instead of returning it to the OS.

A training step allocates and frees the same large temporaries every micro-batch (attention scores,
activations, gradient buckets). glibc serves blocks above its mmap threshold (128 KiB at first,
adapting up to 32 MiB) by ``mmap`` and hands them back on ``free``, and trims the heap's top above
128 KiB; each next allocation then faults its pages in again, zeroed by the kernel. On this 2-core
host that cost a context-parallel step of the grid model (hidden 64, sequence 1,024, cp = 2) about a
quarter of its time (0.47-0.54 s against 0.30-0.37 s with the setting below). PyTorch's CPU performance guide makes the same point and
suggests jemalloc or tcmalloc; meshwise adds no dependency and sets glibc's own knobs instead:

    mallopt(M_MMAP_THRESHOLD, 32 MiB)  blocks up to glibc's largest threshold come from the heap
    mallopt(M_TRIM_THRESHOLD, 2 GiB)   the heap is not trimmed back between steps

The rank's resident memory then stays at its peak, which training reaches every step anyway.
Set on ranks of one thread only (every rank of a multi-process CPU run, where it was measured):
one process of two threads (the default ``train`` of ``small`` on this host) ran 133 or 160 ms
per step by launch with it, 135-137 ms without (five launches each way). ``meshwise calibrate``'s ranks (one thread)
run under it, so its component timings and the steps it predicts see one allocator. Not glibc
(musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc refuses more than HEAP_MAX / 2 (32 MiB on 64-bit)
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int


def keep_freed_host_memory() -> bool:
    """Set glibc's thresholds above (once per process; idempotent); False where libc has no mallopt."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    trim_ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return bool(mmap_ok and trim_ok)
