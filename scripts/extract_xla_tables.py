"""Turn OpenXLA's published H100 (sm_90) performance tables into meshwise's component data.

OpenXLA ships measured GEMM and collective timings as text protos (Apache-2.0):
xla/service/gpu/model/default_matmul_perf_table.txtpb and default_collective_perf_table.txtpb
(commit ad6eaee1b2f13931e3ceb26dc50bf3ac6b425496, "Convert performance tables into embedded
textproto", 2026-07-10). This script reads the two files and writes the sm_90 rows as CSV
(numbers only) to src/meshwise/catalog/components_gemm_xla.csv and components_collectives.csv.

    python scripts/extract_xla_tables.py MATMUL.txtpb COLLECTIVE.txtpb
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CATALOG = Path(__file__).resolve().parents[1] / "src/meshwise/catalog"
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8-e4m3"}
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


def _device_section(text: str, key: str) -> str:
    start = text.index(f'key: "{key}"')
    end = text.find('\nentries {\n  key: "', start)
    return text[start : end if end > 0 else len(text)]


def gemm_rows(text: str) -> list[str]:
    rows = []
    for entry in _device_section(text, "sm_90").split("\n    entries {")[1:]:
        b, m, n, k = (int(re.search(rf"\n      {x}: (\d+)", entry).group(1)) for x in "bmnk")
        for key, value in re.findall(r'flops \{ key: "([^"]+)" value: (\d+) \}', entry):
            if key in DTYPES:
                rows.append(f"h100,{DTYPES[key]},{b},{m},{n},{k},{int(value) / 1e12:.2f},xla")
    return rows


def collective_rows(text: str) -> list[str]:
    rows = []
    for entry in _device_section(text, "sm_90").split("\n    entries {")[1:]:
        op = re.search(r'opcode: "([a-z-]+)"', entry).group(1)
        groups = re.search(r"num_devices_per_group: (\d+)", entry)
        if op == "collective-permute" or not groups:
            continue
        elem = ELEMENT_BYTES[re.search(r"element_type: (\w+)", entry).group(1)]
        elems = 1
        for d in re.findall(r"\n          dimensions: (\d+)", entry):
            elems *= int(d)
        rate = int(re.search(r"network_throughput_bytes_per_sec: (\d+)", entry).group(1))
        size = elems * elem
        rows.append(f"h100,{op.replace('-', '_')},{groups.group(1)},{size},{size / rate:.4e},xla")
    return rows


def main(matmul: str, collective: str) -> None:
    gemm = sorted(set(gemm_rows(Path(matmul).read_text())))
    (CATALOG / "components_gemm_xla.csv").write_text(
        "# H100 SXM GEMM throughput by shape, measured by OpenXLA (sm_90 rows of\n"
        "# xla/service/gpu/model/default_matmul_perf_table.txtpb @ ad6eaee1b2f13931e3ceb26dc50bf3ac6b425496;\n"
        "# source key xla). tflops = 2*b*m*n*k / time. Written by scripts/extract_xla_tables.py.\n"
        "gpu,dtype,b,m,n,k,tflops,source\n" + "\n".join(gemm) + "\n"
    )
    coll = sorted(set(collective_rows(Path(collective).read_text())))
    (CATALOG / "components_collectives.csv").write_text(
        "# H100 SXM (one 8-GPU NVLink node) collective times by payload and group size, measured by\n"
        "# OpenXLA (sm_90 rows of xla/service/gpu/model/default_collective_perf_table.txtpb\n"
        "# @ ad6eaee1b2f13931e3ceb26dc50bf3ac6b425496; source key xla): bytes = the size of the instruction's result\n"
        "# (all-gather: the gathered tensor; reduce-scatter: one shard; all-reduce, all-to-all: the buffer),\n"
        "# seconds = bytes / the table's network_throughput_bytes_per_sec. Written by scripts/extract_xla_tables.py.\n"
        "gpu,op,ranks,bytes,seconds,source\n" + "\n".join(coll) + "\n"
    )
    print(f"{len(gemm)} GEMM rows, {len(coll)} collective rows")


if __name__ == "__main__":
    main(*sys.argv[1:3])
