"""Time and peak memory of `sinklab lm --model smollm2` (issue: at most 3 minutes including the
model load, under 4 GiB), measured on a child process so the figures are the command's own.

    python benchmarks/lm_speed.py [--out DIR]

Prints the wall time, the model load and analysis times the command records, and the child's
peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="sinklab-lm-bench-")) / "lm"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sinklab", "lm", "--model", "smollm2", "--out",
                    str(out)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
    result = json.loads((out / "smollm2" / "lm.json").read_text())
    print(f"sinklab lm --model smollm2: {wall:.1f} s wall (limit 180 s), model load "
          f"{result['load_s']:.1f} s, load + analysis {result['total_s']:.1f} s; peak resident "
          f"memory {peak_mib:.0f} MiB (limit 4096 MiB)")


if __name__ == "__main__":
    main()
