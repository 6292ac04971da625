"""``sinklab results DIR``: a sweep folder's cells in the terminal, filtered, or as CSV; with
``--by KEY``, one row per value of a grid key (or the seed) instead: its cells by status and,
for each metric, the median and the range over its cells.

A cell is ``running`` only while a worker computes it (queued ones are ``pending``, and so are
those a killed sweep left "running" while no process writes the folder); a cell whose
run diverged is ``failed`` with the reason "diverged at step N", and its metrics other than
``sinklab.sweeps.store.KEPT_WHEN_DIVERGED`` are blank, here and in the CSV.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from sinklab.config import value_text
from sinklab.errors import ConfigError
from sinklab.formats import mass_text
from sinklab.metrics import METRICS
from sinklab.runs import folders
from sinklab.runs.files import write_atomic
from sinklab.sweeps.store import (
    STATUSES,
    Store,
    is_diverged,
    metric_names,
    shown_metrics,
    to_csv,
)

CSV_HEAD = b"name,status,reason"  # how every CSV of cells begins (sweeps.store.to_csv)
GROUPED_HEAD = b"by,value,cells"  # how every CSV of groups begins (``grouped_csv``)


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
            head = f.read(max(len(CSV_HEAD), len(GROUPED_HEAD)))
        if not head.startswith((CSV_HEAD, GROUPED_HEAD)):
            raise ConfigError(f"--csv {path} exists and is not a CSV that `sinklab results` "
                              "wrote; choose a new file name.")
    parent = next(folders.marked_parents(path), None)
    if parent is not None:
        raise ConfigError(f"--csv {path} is inside the sinklab folder {parent}, whose files "
                          "are sinklab's own; write the CSV elsewhere.")


def _fmt(value: Any, metric: str | None = None) -> str:
    """A value for the terminal: a BOS mass (a metric of kind "mass") as ``mass_text`` has it,
    steps and counts whole (a median may end in .5), other numbers with 3 significant digits."""
    if value is None:
        return "-"
    kind = METRICS[metric].kind if metric in METRICS else None
    if kind == "mass" and isinstance(value, float):
        return mass_text(value)
    if kind in ("steps", "count") and isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _print_table(table: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def grid_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The keys a sweep's cells can be grouped or filtered by: its grid keys, then ``seed``."""
    return list(dict.fromkeys(k for r in rows for k in r["overrides"])) + ["seed"]


def _order(value: Any) -> tuple[int, Any]:
    """Group values in order: numbers by size, then text, then cells without the key."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 0, value
    return (1, str(value)) if value is not None else (2, "")


def group(rows: list[dict[str, Any]], by: str) -> list[tuple[Any, list[dict[str, Any]]]]:
    """The rows grouped by their value of the grid key ``by`` (or ``seed``), sorted by it."""
    groups: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    for r in rows:
        value = r["seed"] if by == "seed" else r["overrides"].get(by)
        groups.setdefault(repr(value), (value, []))[1].append(r)
    return sorted(groups.values(), key=lambda item: _order(item[0]))


def _numbers(cells: list[dict[str, Any]], metric: str) -> list[float]:
    """A metric's values over the cells that have it (a diverged cell keeps only a few)."""
    values = (shown_metrics(r).get(metric) for r in cells)
    return [float(v) for v in values if isinstance(v, (int, float))]


def _stat_text(values: list[float], metric: str) -> str:
    """A metric over a group for the terminal: "median [lowest, highest]", a flag as "k/n"."""
    if not values:
        return "-"
    if METRICS[metric].kind == "flag":
        return f"{sum(v > 0 for v in values)}/{len(values)}"
    median = _fmt(statistics.median(values), metric)
    if min(values) == max(values):
        return median
    return f"{median} [{_fmt(min(values), metric)}, {_fmt(max(values), metric)}]"


def _counts(cells: list[dict[str, Any]]) -> dict[str, int]:
    return {s: sum(r["status"] == s for r in cells) for s in STATUSES}


def grouped_table(groups: list[tuple[Any, list[dict[str, Any]]]], by: str) -> list[list[str]]:
    """The terminal's table of ``groups``: per value of ``by``, its cells by status and each
    listed metric's median and range."""
    shown = columns()
    statuses = [s for s in ("done", "failed", "pending", "running")
                if s != "running" or any(_counts(cells)["running"] for _, cells in groups)]
    table = [[by, "cells", *statuses, *shown]]
    for value, cells in groups:
        counts = _counts(cells)
        table.append([value_text(value), str(len(cells)), *(str(counts[s]) for s in statuses),
                      *(_stat_text(_numbers(cells, m), m) for m in shown)])
    return table


def grouped_csv(groups: list[tuple[Any, list[dict[str, Any]]]], by: str) -> str:
    """``groups`` as CSV: per value of ``by``, its cells by status and, for every metric the
    store keeps, the median, lowest and highest over its cells (blank where none has it)."""
    names = metric_names()
    fields = ["by", "value", "cells", *STATUSES,
              *(f"{m}_{s}" for m in names for s in ("median", "min", "max"))]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(fields)
    for value, cells in groups:
        counts = _counts(cells)
        row: list[Any] = [by, value, len(cells), *(counts[s] for s in STATUSES)]
        for m in names:
            values = _numbers(cells, m)
            row += [statistics.median(values), min(values), max(values)] if values \
                else ["", "", ""]
        writer.writerow(row)
    return buf.getvalue()


def list_results(folder: Path, status: str | None, where: list[str],
                 csv_path: Path | None, by: str | None = None) -> int:
    store = Store.read(folder)
    try:
        rows = store.rows()
    finally:
        store.close()
    if folders.writer(folder) is None:  # no sweep is running: "running" rows were left by one
        rows = [{**r, "status": "pending"} if r["status"] == "running" else r for r in rows]
    counts = _counts(rows)
    keys = grid_keys(rows)
    if by is not None and by not in keys:
        raise ConfigError(f"--by {by!r} is not a grid key of this sweep: choose one of "
                          f"{', '.join(keys)}.")
    rows = select(rows, status, where)
    groups = group(rows, by) if by is not None else []
    if csv_path is not None:
        check_csv_target(csv_path)
        if by is not None:
            write_atomic(csv_path, grouped_csv(groups, by).encode())
            print(f"wrote {len(groups)} groups of {len(rows)} cells to {csv_path}")
        else:
            write_atomic(csv_path, to_csv(rows).encode())
            print(f"wrote {len(rows)} cells to {csv_path}")
        return 0
    if by is not None:
        _print_table(grouped_table(groups, by))
        print(f"{len(rows)} of {sum(counts.values())} cells in {len(groups)} groups by {by}; "
              "a metric is the median over the group's cells [lowest, highest]",
              file=sys.stderr)
        return 0
    shown = columns()
    table = [["cell", "status", *shown, "reason"]]
    for r in rows:
        m = shown_metrics(r)
        # a diverged cell's other metrics are blank, not "-": measured, but meaningless
        table.append([r["name"], r["status"],
                      *("" if c not in m and is_diverged(r) else _fmt(m.get(c), c)
                        for c in shown),
                      r["reason"] or ""])
    _print_table(table)
    print(f"{len(rows)} of {sum(counts.values())} cells shown; " +
          ", ".join(f"{v} {k}" for k, v in counts.items()), file=sys.stderr)
    return 0
