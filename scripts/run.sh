#!/usr/bin/env bash
# The main job on its embedded default: `meshwise train` (the small model on the embedded corpus,
# layout auto; on CPU the planner also splits the cores into processes x threads). Extra arguments
# go to `meshwise`, e.g. `bash scripts/run.sh plan`.
# Installs meshwise[train] (venv.sh): torch, numpy, tokenizers, safetensors and rich, no test oracles.
meshwise_extras=train   # the runtime only; the test oracles are test.sh's
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
if [ "$#" -eq 0 ]; then
  exec meshwise train
fi
exec meshwise "$@"
