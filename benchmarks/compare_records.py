"""Compare two study folders' records field by field: what a change of code that should not
change behaviour (a refactor) must leave as it was.

    python benchmarks/compare_records.py BEFORE_DIR AFTER_DIR

Each folder is one study's ``--out`` (records.json and claims.csv). Printed: every field that
differs, then their count. Left out, since they differ from run to run whatever the code: the
history of invocations, dates, the machine, versions, the command, the workers, and wall times
and speeds (``*_time_s``, ``*_s`` of a duration, ``seconds``, ``tokens_per_s``). Produce the
two folders with the same command at one thread (``OMP_NUM_THREADS=1``), e.g. a study's
``--quick`` from a worktree of the older commit (``PYTHONPATH=WORKTREE/src``) and from this
checkout.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

LEFT_OUT = {"date", "versions", "machine", "history", "command", "workers", "invocations",
            "seconds", "tokens_per_s", "wall_time_s", "train_time_s", "load_s", "total_s"}


def _left_out(key: str) -> bool:
    return key in LEFT_OUT or key.endswith("_time_s") or key.endswith("_seconds")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every place where ``a`` and ``b`` (JSON values) differ, as 'path: a vs b'."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if _left_out(key):
                continue
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'AFTER' if key not in a else 'BEFORE'}")
            else:
                out += differences(a[key], b[key], f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [f"{path}: {len(a)} items vs {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return [] if a == b or both_nan else [f"{path}: {a!r} vs {b!r}"]


def main(before: Path, after: Path) -> int:
    found = differences(json.loads((before / "records.json").read_text()),
                        json.loads((after / "records.json").read_text()))
    if (before / "claims.csv").read_text() != (after / "claims.csv").read_text():
        found.append("claims.csv differs")
    for line in found:
        print(line)
    print(f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/compare_records.py BEFORE_DIR AFTER_DIR")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
