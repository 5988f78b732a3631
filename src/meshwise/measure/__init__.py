"""Prediction beside reality: run a layout for a few steps, measure memory, communication and time
per rank with PyTorch's own tools, and compare with what the cost model predicts (``compare``);
microbenchmark the machine into a profile the planner uses (``calibrate``).

- ``command``: ``meshwise measure``; ``run``: its workers through the one launcher; ``worker``: one
  rank; ``compare``: predicted beside measured, figure by figure (pure Python);
- ``comm_trace``: the collectives a step issues; ``timing``: the step split into timed parts;
  ``timeline``: the measured pipeline timeline;
- ``calibrate``: ``meshwise calibrate`` and the profile it writes; ``calibrate_worker``: one rank's
  microbenchmarks; ``auto_profile``: this machine's profile, measured once and cached; ``probe``: a
  few seconds' look at whether a cached one still holds;
- ``verify``: ``meshwise verify``; ``verify_worker``: one rank traced on fake devices; ``rank_trace``:
  what one trace is of;
  ``fake_cuda``: the fake CUDA device a GPU profile is traced on; ``_trace_preload``: what the trace
  processes import first;
- ``_torch_tools``: the one place meshwise reaches into torch's private memory trackers.
"""
