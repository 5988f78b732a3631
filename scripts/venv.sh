# Sourced by run.sh, test.sh and gpu_check.sh: make .venv (once) and install meshwise into it with the
# extras the caller names in `meshwise_extras` (run.sh: train, the runtime; test.sh: train,test,report,
# adding the test oracles). torch is pinned through constraints.txt so pip takes the local CPU wheel,
# never a CUDA build. MESHWISE_TORCH_INDEX (gpu_check.sh sets it on a CUDA machine): the wheel index
# torch 2.13.0 is taken from instead, e.g. PyTorch's CUDA 12.8 builds (2.13.0+cu128, which the pin
# admits); the pin stays.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MESHWISE_VENV:-$root/.venv}"
stamp="$venv/.meshwise-installed"   # the extras installed, one per line
wanted="${meshwise_extras:-train}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# Reinstall when the project's requirements change (pyproject or constraints newer than the stamp) or
# an extra is asked for that is not installed yet; what was installed before is installed again.
have=""
[ -f "$stamp" ] && have="$(tr '\n' ',' < "$stamp")"
missing=0
for extra in ${wanted//,/ }; do
  case ",$have" in *",$extra,"*) ;; *) missing=1 ;; esac
done
if [ ! -f "$stamp" ] || [ "$missing" = 1 ] || [ "$root/pyproject.toml" -nt "$stamp" ] || [ "$root/constraints.txt" -nt "$stamp" ]; then
  extras="$(printf '%s\n' ${have//,/ } ${wanted//,/ } | sort -u | paste -sd, -)"
  # --no-compile: pip byte-compiles every file it installs, one at a time (torch's alone took 11 s of a
  # fresh install on 2 cores); one compileall on every core does it below instead.
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile -c "$root/constraints.txt")
  "${pip[@]}" ${MESHWISE_TORCH_INDEX:+--index-url "$MESHWISE_TORCH_INDEX"} torch==2.13.0
  "${pip[@]}" -e "$root[$extras]"
  case ",$extras," in *,test,*)
    # torchtitan, the oracle of plan --emit torchtitan, without its `datasets` pin (tests/_stubs/README.md);
    # what it imports is in the test extra.
    "${pip[@]}" --no-deps torchtitan==0.3.0 ;;
  esac
  # Byte-compile what was installed, as pip would, and src/meshwise (the editable install reads it
  # from there), so that where PYTHONDONTWRITEBYTECODE is set no command recompiles what it imports
  # (uncompiled, torch's import alone takes 2.4 s instead of 1.3 s). -j 0: a worker per core. Files
  # this Python cannot compile (torch ships some in 3.12 syntax) are skipped, as pip skips them.
  # Python ignores a .pyc older than its source.
  "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null 2>&1 || true
  "$venv/bin/python" -m compileall -q -j 0 "$root/src/meshwise" >/dev/null
  printf '%s\n' ${extras//,/ } > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
