#!/usr/bin/env bash
# The main job on its embedded default: `meshwise train` (the small model on the embedded corpus,
# layout auto, 4 CPU processes). Extra arguments go to `meshwise`, e.g. `bash scripts/run.sh plan`.
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
if [ "$#" -eq 0 ]; then
  exec meshwise train
fi
exec meshwise "$@"
