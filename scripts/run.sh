#!/usr/bin/env bash
# The main job on its embedded default. Extra arguments go to `meshwise`.
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
if [ "$#" -eq 0 ]; then
  exec meshwise plan
fi
exec meshwise "$@"
