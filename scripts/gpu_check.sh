#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): on whatever CUDA device this machine has, in one go,
#   1. meshwise calibrate --device cuda (GEMMs bf16/fp8, grouped GEMMs, attention, HBM, NCCL), under 2 min;
#   2. meshwise measure of a ~1B model on one GPU in bf16 and fp8 beside the plan (MFU, CUDA memory);
#   3. 3 steps of plan --emit torchtitan's configuration under torchtitan's trainer;
# within 10 minutes (the install before it aside), writing benchmarks/results/gpu-check-<device>.txt.
#
#   bash scripts/gpu_check.sh            # a CUDA machine: installs .venv-cuda (CUDA torch 2.13.0) on first use
#   bash scripts/gpu_check.sh --cpu      # the same steps on the CPU at toy sizes (CI: the plumbing only)
#   ... --no-venv                        # use the python on PATH as it is (no install)
#   ... --out-dir DIR                    # write the result there instead of benchmarks/results
#
# Exit status: 0 all steps passed, 1 a step failed, 2 no CUDA device (without --cpu).
# MESHWISE_TORCH_INDEX: the wheel index of the CUDA build (default PyTorch's CUDA 12.8 index); torch
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
    export MESHWISE_TORCH_INDEX="${MESHWISE_TORCH_INDEX:-https://download.pytorch.org/whl/cu128}"
    export MESHWISE_VENV="${MESHWISE_VENV:-$root/.venv-cuda}"
  fi
  # shellcheck source=venv.sh
  source "$root/scripts/venv.sh"
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cd "$root"
timeout 590 python benchmarks/gpu_check.py "${args[@]}"
