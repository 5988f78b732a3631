#!/usr/bin/env bash
# The whole test suite; extra arguments go to pytest. Only the fast unit tests:
#   bash scripts/test.sh -m "not integration"
# Installs what the tests need: the Python side through venv.sh (a venv run.sh made gets the test
# extra added), and Debian's chromium (the report test opens plan.html in it) with apt-get when this
# user is root; otherwise one line says what to run.
meshwise_extras=train,test,report   # the runtime, the oracles and linters, the report's pictures
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
cd "$root"

# Does this run select the report test? Yes unless the arguments name test files and none is it.
wants_chromium=1
for arg in "$@"; do
  case "$arg" in
    *test_report.py*) wants_chromium=1; break ;;
    tests/*|*/tests/*|test_*.py*) wants_chromium=0 ;;
  esac
done
if [ "$wants_chromium" = 1 ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing Debian's chromium for the report test (apt-get)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
  else
    echo "scripts/test.sh: the report test needs Chromium; run: sudo apt-get install chromium" >&2
  fi
fi
# The fake CUDA device of tests/test_fake_cuda.py is compiled with g++ (Debian's g++ when root).
if ! command -v g++ >/dev/null 2>&1 && [ -z "${CXX:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing Debian's g++ for the fake CUDA device test (apt-get)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++) >/dev/null
  else
    echo "scripts/test.sh: the fake CUDA device test needs a C++ compiler; run: sudo apt-get install g++" >&2
  fi
fi
# Lint first: ruff (errors, import order, likely bugs), ruff's formatter, and the layer contracts
# of docs/design.md.
ruff check --quiet .
ruff format --check --quiet .
lint-imports --no-cache >/dev/null || lint-imports --no-cache
# Two pytest workers (pytest-xdist); the integration tests are two units of work, each run in order
# on one worker (tests/conftest.py work_unit). Pass -n 0 to run in this process (as -s needs).
exec python -m pytest -n 2 "$@"
