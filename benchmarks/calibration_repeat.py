"""How repeatable this machine's calibration is: ``meshwise calibrate``'s quick calibration (the one
``train`` and ``measure`` make at first use) several times in a row at one process count, and the
figures a CPU step rests on, one line per calibration: the compute rate ``peak * efficiency``, the
host time per operator, DTensor's, checkpointing's, the collectives' latency and bandwidth, FSDP's
per-call and per-parameter costs, the GEMM fit's rate and call cost, SDPA's call cost, the copy
bandwidth. Prints, never asserts.

    OMP_NUM_THREADS=1 flock /tmp/meshwise-heavy.lock .venv/bin/python benchmarks/calibration_repeat.py \\
        --nproc 2 --repeats 6 > benchmarks/results/calibration-repeat-cpu2core.txt
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

from meshwise.measure import auto_profile
from meshwise.measure.calibrate import calibrate

KEYS = (
    "op_overhead_s",
    "tp_op_s",
    "checkpoint_call_s",
    "intra_latency_s",
    "intra_bytes_per_s",
    "fsdp_call_s",
    "fsdp_param_s",
    "cpu_gemm_flops_per_s",
    "cpu_gemm_call_s",
    "sdpa_call_s",
    "hbm_bytes_per_s",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    for name in ("nproc", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a positive integer, not {getattr(args, name)}")
    print(f"calibration version {auto_profile.CALIBRATION_VERSION}, {args.nproc} process(es), quick")
    print("#  seconds  rate=peak*efficiency  " + "  ".join(KEYS))
    rates = []
    with tempfile.TemporaryDirectory(prefix="meshwise-calibration-repeat-") as tmp:
        for i in range(args.repeats):
            out = Path(tmp) / f"{i}.toml"
            start = time.perf_counter()
            calibrate(args.nproc, auto_profile.MODEL, str(out), auto_profile.SEQ_LEN, quick=True, note="repeat")
            t = tomllib.loads(out.read_text())
            rates.append(t["peak_fp32_flops_per_s"] * t["efficiency_max"])
            print(
                f"{i}  {time.perf_counter() - start:.0f}  {rates[-1]:.3g}  "
                + "  ".join(f"{t.get(k, 0.0):.3g}" for k in KEYS),
                flush=True,
            )
    print(
        f"rate: least {min(rates):.3g}, median {statistics.median(rates):.3g}, largest {max(rates):.3g} "
        f"({max(rates) / min(rates):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
