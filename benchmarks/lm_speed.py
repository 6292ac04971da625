"""Time and peak memory of `sinklab lm --model smollm2 --probes FILE` with its interventions (the
issue's limit: the default run, interventions included, within 15 minutes on this project's
2-core machine), measured on a child process so that the figures are the command's own.

    python benchmarks/lm_speed.py [--out DIR] [--probes FILE]

FILE defaults to the project's own probe passages, given as a user's file would be. Prints the
wall time, the model load, metrics and intervention times the command records, and the child's
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

LIMIT_S = 15 * 60
PROBES = Path(__file__).resolve().parents[1] / "src" / "sinklab" / "data" / "probes_en.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    parser.add_argument("--probes", default=str(PROBES), help="the probe file (one text a line)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="sinklab-lm-bench-")) / "lm"
    command = [sys.executable, "-m", "sinklab", "lm", "--model", "smollm2", "--probes",
               args.probes, "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
    kept = json.loads((out / "cache" / "smollm2.json").read_text())["result"]
    iv = json.loads((out / "cache" / "smollm2-interventions.json").read_text())["result"]
    print(f"sinklab lm --model smollm2 --probes {Path(args.probes).name}: {wall:.1f} s wall "
          f"(limit {LIMIT_S} s); model load {kept['load_s']:.1f} s, load + metrics "
          f"{kept['total_s']:.1f} s, interventions {iv['seconds']:.1f} s "
          f"({len(iv['heads'])} heads ablated three ways, {len(iv['global'])} global edits, "
          f"{len(iv['streaming'])} StreamingLLM caches, on {len(iv['baseline'])} probes); peak "
          f"resident memory {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
