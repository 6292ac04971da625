"""Results files: atomic JSON writes, the flushed ``metrics.jsonl`` log, and checked reads.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per logged step),
``summary.json``, ``attention.npz`` (mean and std maps over the evaluation set), ``model.pt``
(the final weights) and figures.
``summary.json`` is written last and atomically, so its presence marks a finished run.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sinklab.config import SinklabError


class ResultsError(SinklabError):
    """A results file or folder that is missing, corrupted or not sinklab's."""


def _clean(obj: Any) -> Any:
    """Make numbers JSON-safe: NaN and inf become None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def temporary_path(path: Path) -> Path:
    """A fresh hidden name beside ``path`` for writing before an atomic rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def replace_from(tmp: Path, path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)``, then rename ``tmp`` onto ``path``; remove ``tmp`` on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to ``path`` via a temporary file in the same folder and a rename."""

    def write(tmp: Path) -> None:
        with tmp.open("xb") as f:  # created with the user's umask, like any new file
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    replace_from(temporary_path(path), path, write)


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (non-finite floats become null)."""
    text = json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n"
    write_atomic(path, text.encode())


def read_json(path: Path) -> Any:
    """Read a JSON file, turning a missing or corrupted file into one clear ResultsError."""
    if not path.is_file():
        raise ResultsError(f"{path} does not exist.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path} is corrupted (not valid JSON: {exc}); delete it to redo "
                           "that result.") from None


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Atomically write arrays to a compressed ``.npz`` file."""

    def write(tmp: Path) -> None:
        with tmp.open("xb") as f:
            np.savez_compressed(f, **arrays)

    replace_from(temporary_path(path), path, write)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` file, with a clear error when it is missing or broken."""
    if not path.is_file():
        raise ResultsError(f"{path} does not exist.")
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path} is corrupted ({exc}); delete it to redo that result.") from None


def prepare_run_dir(path: Path, allowed: set[str] | None = None) -> None:
    """Check that ``path`` may receive a new run: absent, empty, or an unfinished run folder.

    A finished run (one with ``summary.json``) and a folder that is not sinklab's are refused,
    never overwritten. With ``allowed`` (the per-seed subfolders of ``train --seeds``), ``path``
    is a parent folder and may hold only entries of those names.
    """
    if (path / "summary.json").exists():
        raise ResultsError(f"{path} already holds a finished run; choose another --out or "
                           "delete it.")
    if allowed is not None:
        foreign = path.is_dir() and any(p.name not in allowed for p in path.iterdir())
        if foreign or (path.exists() and not path.is_dir()):
            raise ResultsError(f"{path} exists and holds other things than the seed folders "
                               f"{', '.join(sorted(allowed))}; choose another --out.")
        return
    if path.exists() and (not path.is_dir() or (any(path.iterdir())
                                                and not (path / "config.json").exists())):
        raise ResultsError(f"{path} exists and is not an empty folder or a sinklab run folder; "
                           "choose another --out.")


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` and flushes each line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("w")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(row), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` log; a torn last line (an interrupted write) is dropped."""
    if not path.is_file():
        raise ResultsError(f"{path} does not exist.")
    rows = []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise ResultsError(f"{path} is corrupted at line {n}.") from None
    return rows
