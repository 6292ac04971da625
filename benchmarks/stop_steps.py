"""The stop steps of two `sinklab reproduce` folders side by side, as a Markdown table.

    SINKLAB_KERNEL=0 sinklab reproduce --out results/pytorch-ops   # PyTorch's operators
    sinklab reproduce --out results/kernel                          # the fused kernel
    python benchmarks/stop_steps.py results/pytorch-ops results/kernel

Both engines compute the same mathematics from the same data streams; only the order of
floating-point operations differs, which can move a long run's stop step. Printed per run: the
engine and stop step of each folder, the difference and its share of the first folder's steps,
the training time per step of each (the run's train_time_s over its steps, in the worker that
trained it), then each folder's training wall time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def runs(folder: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in sorted((folder / "runs").glob("*/summary.json"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = runs(args.before), runs(args.after)
    if sorted(before) != sorted(after) or not before:
        raise SystemExit(f"{args.before} and {args.after} do not hold the same runs.")
    print(f"| run | {args.before} | {args.after} | difference | ms/step before | ms/step after |")
    print("|---|---|---|---|---|---|")
    moved = []
    for name in before:
        a, b = before[name], after[name]
        diff = b["steps"] - a["steps"]
        moved.append(abs(diff) / a["steps"])
        print(f"| {name} | {a['steps']:,} ({a.get('engine', 'pytorch')}) | {b['steps']:,} "
              f"({b.get('engine', 'pytorch')}) | {diff:+,} ({100 * diff / a['steps']:+.2f}%) | "
              f"{1e3 * a['train_time_s'] / a['steps']:.2f} | "
              f"{1e3 * b['train_time_s'] / b['steps']:.2f} |")
    same = sum(m == 0 for m in moved)
    print(f"\n{same} of {len(moved)} runs stop at the same step; the largest move is "
          f"{100 * max(moved):.2f}% of a run's steps.")
    for folder in (args.before, args.after):
        # the folder's first invocation trained its runs: records.json's history (a folder an
        # older sinklab wrote has summary.json with the same fields at its top level)
        if (folder / "records.json").is_file():
            first = json.loads((folder / "records.json").read_text())["meta"]["history"][0]
        else:
            first = json.loads((folder / "summary.json").read_text())
        print(f"{folder}: {first['runs_trained']} runs trained in {first['wall_time_s']:.0f} "
              f"s of wall time ({first['machine']}, {first['workers']} workers)")


if __name__ == "__main__":
    main()
