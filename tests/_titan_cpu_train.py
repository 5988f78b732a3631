"""``python tests/_titan_cpu_train.py ARGS``: torchtitan 0.3.0's own ``torchtitan.train`` entry point,
on a machine without an accelerator.

torchtitan picks its device with torch's accelerator probe and falls back to CUDA when there is
none (Trainer.__init__ then calls torch.cuda.set_device, which a CPU-only torch lacks). Here the probe
answers "cpu", so torchtitan's own code takes the gloo backend; ``torch.cpu`` is given the five
device-memory queries torchtitan's memory monitor reads (name, properties, stats), which a CPU has no
counters for. Nothing else of torchtitan is touched.
"""

from __future__ import annotations

import os
import types

import torch
import torch._utils

if not torch.cuda.is_available():
    torch._utils._get_available_device_type = lambda: "cpu"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shims = {
        "get_device_name": lambda *a: "cpu",
        "reset_peak_memory_stats": lambda *a: None,
        "empty_cache": lambda *a: None,
        "memory_stats": lambda *a: {},
        "get_device_properties": lambda *a: types.SimpleNamespace(total_memory=memory),
    }
    for name, fn in shims.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)

from torchtitan.train import main  # noqa: E402  (after the probe is answered)

if __name__ == "__main__":
    main()
