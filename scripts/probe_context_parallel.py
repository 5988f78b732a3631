"""Does torch's own context parallelism run on CPU/gloo? Run: torchrun --nproc-per-node 2 scripts/probe_context_parallel.py

Tries ``torch.distributed.tensor.experimental.context_parallel`` around a causal SDPA forward and
backward with each SDPA backend and prints OK or the first line of the error per rank. With torch
2.13 on CPU every backend fails (see meshwise/runtime/context_parallel.py), which is why meshwise
runs its own ring attention.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
for backend in (None, SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    cq, ck, cv = (t.clone() for t in (q, k, v))
    try:
        with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2]):
            lq, lk, lv = (t.clone().requires_grad_() for t in (cq, ck, cv))
            if backend is None:
                out = F.scaled_dot_product_attention(lq, lk, lv, is_causal=True)
            else:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(lq, lk, lv, is_causal=True)
            out.sum().backward()
        print(rank, backend, "OK", flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports every failure
        print(rank, backend, "FAIL", type(e).__name__, str(e).splitlines()[0][:160], flush=True)
dist.destroy_process_group()
