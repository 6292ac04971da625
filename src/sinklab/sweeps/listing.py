"""``sinklab results DIR``: a sweep folder's cells in the terminal, filtered, or as CSV.

A cell is ``running`` only while a worker computes it (queued ones are ``pending``, and so are
those a killed sweep left "running" while no process writes the folder); a cell whose
run diverged is ``failed`` with the reason "diverged at step N", and its metrics other than
``sinklab.sweeps.store.KEPT_WHEN_DIVERGED`` are blank, here and in the CSV.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sinklab.errors import ConfigError
from sinklab.metrics import METRICS
from sinklab.runs import folders
from sinklab.runs.files import write_atomic
from sinklab.sweeps.store import STATUSES, Store, is_diverged, shown_metrics, to_csv

CSV_HEAD = b"name,status,reason"  # how every CSV of cells begins (sweeps.store.to_csv)


def columns() -> list[str]:
    """The metrics shown for each cell: those of ``sinklab.metrics.METRICS`` marked ``listed``."""
    return [name for name, m in METRICS.items() if m.listed]


def select(rows: list[dict[str, Any]], status: str | None,
           where: list[str]) -> list[dict[str, Any]]:
    """The rows with ``status`` whose grid values (or seed) match every ``key=value``."""
    if status is not None and status not in STATUSES:
        raise ConfigError(f"--status {status!r} is not allowed: choose one of "
                          f"{', '.join(STATUSES)}.")
    wanted = []
    for item in where:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--where {item!r} is not of the form key=value, for example "
                              "model.attention=relu.")
        wanted.append((key.strip(), value.strip()))
    known = {k for r in rows for k in r["overrides"]} | {"seed"}
    for key, _ in wanted:
        if rows and key not in known:
            raise ConfigError(f"--where {key!r} is not a grid key of this sweep: choose one of "
                              f"{', '.join(sorted(known))}.")

    def text(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    def same(stored: Any, value: str) -> bool:
        if text(stored) == value or str(stored) == value:
            return True
        try:  # 1e-3 matches 0.001
            return not isinstance(stored, str) and float(stored) == float(value)
        except ValueError:
            return False

    def matches(row: dict[str, Any]) -> bool:
        values = {**row["overrides"], "seed": row["seed"]}
        return all(key in values and same(values[key], value) for key, value in wanted)

    return [r for r in rows if (status is None or r["status"] == status) and matches(r)]


def check_csv_target(path: Path) -> None:
    """Refuse a ``--csv FILE`` that is not ours to write: FILE must be new, or a CSV that this
    command wrote before, and not inside a sinklab folder (whose files are its own)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise ConfigError(f"--csv {path} is {kind}; give the name of a new file to write.")
    if path.exists():
        with path.open("rb") as f:
            head = f.read(len(CSV_HEAD))
        if head != CSV_HEAD:
            raise ConfigError(f"--csv {path} exists and is not a CSV that `sinklab results` "
                              "wrote; choose a new file name.")
    parent = next(folders.marked_parents(path), None)
    if parent is not None:
        raise ConfigError(f"--csv {path} is inside the sinklab folder {parent}, whose files "
                          "are sinklab's own; write the CSV elsewhere.")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def list_results(folder: Path, status: str | None, where: list[str],
                 csv_path: Path | None) -> int:
    store = Store.read(folder)
    try:
        rows = store.rows()
    finally:
        store.close()
    if folders.writer(folder) is None:  # no sweep is running: "running" rows were left by one
        rows = [{**r, "status": "pending"} if r["status"] == "running" else r for r in rows]
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    rows = select(rows, status, where)
    if csv_path is not None:
        check_csv_target(csv_path)
        write_atomic(csv_path, to_csv(rows).encode())
        print(f"wrote {len(rows)} cells to {csv_path}")
        return 0
    shown = columns()
    table = [["cell", "status", *shown, "reason"]]
    for r in rows:
        m = shown_metrics(r)
        # a diverged cell's other metrics are blank, not "-": measured, but meaningless
        table.append([r["name"], r["status"],
                      *("" if c not in m and is_diverged(r) else _fmt(m.get(c)) for c in shown),
                      r["reason"] or ""])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"{len(rows)} of {sum(counts.values())} cells shown; " +
          ", ".join(f"{v} {k}" for k, v in counts.items()), file=sys.stderr)
    return 0
