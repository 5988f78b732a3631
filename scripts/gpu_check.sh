#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): on whatever CUDA device this machine has, in one go,
#   1. meshwise calibrate --device cuda (GEMMs bf16/fp8, grouped GEMMs, attention, HBM, NCCL), under 2 min;
#   2. meshwise measure of a ~1B model on one GPU in bf16 and fp8 beside the plan (MFU, CUDA memory);
#   3. 3 steps of plan --emit torchtitan's configuration under torchtitan's trainer;
# within 10 minutes (the install before it aside), writing benchmarks/results/gpu-check-<device>.txt.
#
#   MESHWISE_TORCH_INDEX=URL bash scripts/gpu_check.sh   # a CUDA machine: installs .venv-cuda (CUDA torch 2.13.0) once
#   bash scripts/gpu_check.sh --cpu      # the same steps on the CPU at toy sizes (CI: the plumbing only)
#   ... --no-venv                        # use the python on PATH as it is (no install)
#   ... --out-dir DIR                    # write the result there instead of benchmarks/results
#
# Exit status: 0 all steps passed, 1 a step failed, 2 no CUDA device (without --cpu).
# MESHWISE_TORCH_INDEX: a wheel index holding the CUDA build (required unless --no-venv); torch
# stays pinned to 2.13.0 by constraints.txt, and without a CUDA device the script never installs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cpu=0
venv=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu=1; args+=(--cpu) ;;
    --no-venv) venv=0 ;;
    --out-dir) args+=(--out-dir "$2"); shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (valid: --cpu, --no-venv, --out-dir DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$cpu" = 0 ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  echo "gpu_check.sh: no CUDA device here (nvidia-smi lists none); --cpu runs the same steps on the CPU at toy sizes" >&2
  exit 2
fi
if [ "$venv" = 1 ]; then
  if [ "$cpu" = 0 ]; then
    if [ -z "${MESHWISE_TORCH_INDEX:-}" ]; then
      echo "gpu_check.sh: set MESHWISE_TORCH_INDEX to a wheel index with CUDA builds of torch 2.13.0, or pass --no-venv to use the python on PATH" >&2
      exit 2
    fi
    export MESHWISE_VENV="${MESHWISE_VENV:-$root/.venv-cuda}"
  fi
  export meshwise_extras="train,test,fp8"  # the runtime, torchtitan (the --emit steps) and torchao (fp8)
  # shellcheck source=venv.sh
  source "$root/scripts/venv.sh"
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cd "$root"
timeout 590 python benchmarks/gpu_check.py "${args[@]}"
