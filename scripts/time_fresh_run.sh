#!/usr/bin/env bash
# How long `bash scripts/run.sh` (the main job, installing included) takes on a fresh machine, as near
# as one host allows: a fresh clone of this repository at REV in a new folder, a fresh venv
# (MESHWISE_VENV), pip's cache off (PIP_NO_CACHE_DIR=1), an empty cache for meshwise's calibration
# and pip (XDG_CACHE_HOME), no PYTHONPATH and no venv of the caller's on PATH. torch comes from
# where scripts/venv.sh takes it (constraints.txt's pin: the local wheel here).
#   bash scripts/time_fresh_run.sh REV [TAG]    # one line: install_s, job_s, total_s, the job's rc
# The install's seconds are `run.sh --help` on the fresh venv less `run.sh --help` once installed;
# the job's are `run.sh` with its defaults on the installed venv. Its folder, /tmp/meshwise-fresh-TAG,
# keeps job.log (the job's output) and install.trace (venv.sh's commands, each with its start time);
# the venv is removed at the end. Time it on a quiet host: on a shared one, under its CPU lock.
set -euo pipefail
rev="${1:?usage: time_fresh_run.sh REV [TAG]}"
tag="${2:-$rev}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="/tmp/meshwise-fresh-$tag"
rm -rf "$dir"
mkdir -p "$dir"
git clone -q "$root" "$dir/repo"
git -C "$dir/repo" checkout -q "$rev"
export MESHWISE_VENV="$dir/venv" PIP_NO_CACHE_DIR=1 XDG_CACHE_HOME="$dir/cache"
unset PYTHONPATH MESHWISE_CACHE_DIR VIRTUAL_ENV
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v '/\.venv[^/]*/bin$' | paste -sd: -)"
cd "$dir/repo"
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start="$(load)"
t0=$EPOCHREALTIME
bash -c 'PS4="+ \$EPOCHREALTIME "; set -x; source scripts/run.sh --help' >/dev/null 2>"$dir/install.trace"
t1=$EPOCHREALTIME
bash scripts/run.sh --help >/dev/null
t2=$EPOCHREALTIME
rc=0
bash scripts/run.sh >"$dir/job.log" 2>&1 || rc=$?
t3=$EPOCHREALTIME
rm -rf "$MESHWISE_VENV"
awk -v rev="$(git rev-parse --short HEAD)" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" -v rc="$rc" \
  -v l0="$load_start" -v l1="$(load)" 'BEGIN {
    install = (t1 - t0) - (t2 - t1); job = t3 - t2
    printf "%s install_s %.1f job_s %.1f total_s %.1f rc %d load %s -> %s\n", rev, install, job, install + job, rc, l0, l1 }'
