"""The cost model: what a layout costs per rank, in pure Python (never imports torch).

- ``estimate``: one layout's estimate (memory of the largest rank, step time, collectives,
  throughput), composed from the modules below;
- ``memory``: per-rank memory at the step's peak, by category; ``activations``: one block's
  activations, tensor by tensor; ``memory_peaks``: peak totals shared across one search's layouts;
  ``megatron_memory``: per-rank memory under Megatron-Core (``--runtime megatron``);
- ``compute``: the FLOPs of a step; ``kernels``: GPU compute time operation by operation, of one
  rank's micro-batch (``rank_work``: what that rank does of it);
  ``host``: what a CPU step costs beyond its FLOPs (operator launches, DTensor, FSDP2, optimizer);
  ``fp8``: the float8 formats' GEMMs and casts;
- ``comm``: the collectives a layout implies and their cost; ``experts``: expert parallelism's
  all-to-alls; ``context_parallel``: what a cp ring changes for one rank;
- ``pipeline``: the schedules' micro-batches in flight and bubble;
- ``plan_cache``: one plan's caches of what holds for a (model, cluster, setting).

The formulas and their sources: docs/cost-model.md.
"""
