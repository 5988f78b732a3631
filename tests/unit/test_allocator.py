"""launch/allocator.py: a CPU rank keeps its freed memory (glibc's thresholds), set by every gloo rank."""

import ctypes.util
import platform

import pytest

from meshwise.launch import allocator


@pytest.mark.skipif(
    platform.system() != "Linux" or not ctypes.util.find_library("c") or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt only",
)
def test_glibc_accepts_both_thresholds():
    # mallopt returns 0 for a value glibc refuses (an mmap threshold above 32 MiB): both must hold
    assert allocator.MMAP_THRESHOLD_BYTES <= 32 << 20
    assert allocator.keep_freed_host_memory() is True


@pytest.mark.parametrize("threads, expected", [(1, ["set", "group"]), (2, ["group"])])
def test_a_one_thread_gloo_rank_sets_it_before_its_process_group(monkeypatch, threads, expected):
    import torch

    import meshwise.launch as launch

    calls = []
    monkeypatch.setattr(launch, "keep_freed_host_memory", lambda: calls.append("set") or True)
    monkeypatch.setattr("torch.distributed.init_process_group", lambda *a, **k: calls.append("group"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(launch.RUN_DIR_ENV, "/nonexistent-meshwise-test")
    monkeypatch.setattr(
        "torch.distributed.FileStore", lambda *a, **k: type("S", (), {"set_timeout": lambda s, t: None})()
    )
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    launch.init_process_group("gloo")
    assert calls == expected
