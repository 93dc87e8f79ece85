"""Which oneDNN kernels a bfloat16 encoder forward runs on this CPU (``ONEDNN_VERBOSE``): on a
CPU with AMX, torch's bfloat16 matrix products should run in AMX kernels (``..._amx``).

    python bench/onednn_census.py [--shape BERT-base] [--batch 32] [--length 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHILD = """
import sys, torch
sys.path.insert(0, {here!r})
from teacher_topk import SHAPES, build_model
torch.set_num_threads({threads})
model = build_model(SHAPES[{shape!r}], 30522).eval()
ids = torch.randint(5, 30000, ({batch}, {length}))
with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
    model.bert(input_ids=ids)  # a first call: oneDNN picks and builds its kernels
    print("census-start", flush=True)
    model.bert(input_ids=ids)
"""


def census(shape: str, batch: int, length: int, threads: int) -> dict[str, Any]:
    """oneDNN primitives executed by the second bfloat16 encoder forward of ``shape``: per
    (kind, implementation), calls and milliseconds; and the share of the time in AMX kernels."""
    code = CHILD.format(here=str(HERE), shape=shape, batch=batch, length=length, threads=threads)
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    lines = done.stdout.split("census-start", 1)[-1].splitlines()
    isa = next((ln.split("isa:", 1)[1] for ln in done.stdout.splitlines() if "isa:" in ln), "")
    calls: Counter[tuple[str, str]] = Counter()
    millis: Counter[tuple[str, str]] = Counter()
    for line in lines:
        parts = line.split(",")
        if len(parts) > 6 and parts[0] == "onednn_verbose" and parts[3] == "exec":
            key = (parts[5], parts[6])  # kind (matmul, inner_product...), implementation
            calls[key] += 1
            millis[key] += float(parts[-1])
    total = sum(millis.values())
    amx = sum(v for (_, impl), v in millis.items() if "amx" in impl)
    rows = [
        [kind, impl, calls[(kind, impl)], round(ms, 2)] for (kind, impl), ms in millis.most_common()
    ]
    return {
        "isa": isa.strip(),
        "rows": rows,
        "milliseconds": round(total, 2),
        "amx_share": amx / total if total else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="BERT-base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(census(args.shape, args.batch, args.length, args.threads), indent=1))


if __name__ == "__main__":
    main()
