"""The memory estimate behind the size limits (``sinklab.runs.limits``) against measured peaks.

    python benchmarks/memory_estimate.py

Each configuration trains (a few steps) and evaluates in a fresh process; the peak resident
memory above the process's own baseline (torch imported, nothing allocated) is set beside
``limits.run_bytes``. The estimate should be an upper bound that is not absurdly loose: the last
column (measured / estimated) should lie below 1. Every case stays under about 2 GiB.
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = [
    ("1x1, paper", ["model.attention=relu"], 1),
    ("4x4, paper", ["model.n_layers=4", "model.n_heads=4"], 1),
    ("1x1, 32 members", [], 32),
    ("2x2, seq_len 64, 4 members", ["model.n_layers=2", "model.n_heads=2", "task.seq_len=64",
                                    "task.eval_trigger=7"], 4),
    ("1x1, seq_len 128, d_model 64", ["task.seq_len=128", "task.d_model=64"], 1),
    ("2x2 standard, seq_len 32", ["model.n_layers=2", "model.n_heads=2", "model.block=standard",
                                  "task.seq_len=32"], 2),
    ("4x4, 4000 test sequences", ["model.n_layers=4", "model.n_heads=4",
                                  "eval.n_sequences=4000"], 1),
]

CHILD = """
import json, resource, sys
import torch
from sinklab.config import config_from_cli
from sinklab.runs.limits import run_bytes
from sinklab.train import train_runs
torch.set_num_threads(1)
overrides, members = json.loads(sys.argv[1]), int(sys.argv[2])
cfg = config_from_cli(overrides + ["train.max_steps=3", "train.device=cpu"])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
train_runs([cfg.__class__(**{**cfg.__dict__}) for _ in range(members)])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"measured": peak - base, "estimated": run_bytes(cfg, members)}))
"""


def main() -> None:
    print(f"{'configuration':34s} {'measured':>10s} {'estimated':>10s} {'ratio':>6s}")
    for name, overrides, members in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(overrides), str(members)],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = row["measured"] / row["estimated"]
        print(f"{name:34s} {row['measured'] / 2**20:8.1f} M {row['estimated'] / 2**20:8.1f} M "
              f"{ratio:6.2f}")


if __name__ == "__main__":
    main()
