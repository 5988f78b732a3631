#!/usr/bin/env bash
# The whole test suite. Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
cd "$root"
exec python -m pytest "$@"
