"""Results files: atomic JSON writes, the flushed ``metrics.jsonl`` log, and checked reads.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per logged step, read
with ``read_log``), ``summary.json``, ``attention.npz`` (mean and std maps over the evaluation
set), ``model.pt`` (the final weights), figures, and ``sinklab.json``, whose completion record
(written last, see ``sinklab.runs.folders``) marks a finished run. Binary files are written byte for
byte the same for the same arrays, so two identical runs leave identical files.
"""

from __future__ import annotations

import io
import json
import math
import os
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sinklab.errors import ResultsError


def jsonable(obj: Any) -> Any:
    """Make numbers JSON-safe: NaN and inf become None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def temporary_path(path: Path) -> Path:
    """A fresh hidden name beside ``path`` for writing before an atomic rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def named(exc: OSError, path: Path) -> OSError:
    """``exc`` as an error about ``path``, the file the user knows of (a failed write names no
    file, a failed rename names our temporary file)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def replace_from(tmp: Path, path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)``, then rename ``tmp`` onto ``path``; remove ``tmp`` on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, path) from None
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
    text = json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n"
    write_atomic(path, text.encode())


def read_json(path: Path, remedy: str = "delete it to redo that result") -> Any:
    """Read a JSON file, turning a missing or corrupted file into one clear ResultsError; a
    corrupted file's message ends with ``remedy``, what to do about it (a caller that knows
    better than deleting the file says so: a folder's marker, ``sinklab.runs.folders``, is never
    read here)."""
    if not path.is_file():
        raise ResultsError(f"{path} is a folder, not a JSON file." if path.is_dir()
                           else f"{path} does not exist.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path} is corrupted (not valid JSON: {exc}); {remedy}.") from None


# A fixed time stamp for the members of .npz archives, so that the same arrays give the same
# bytes (numpy's own savez stamps each member with the current time).
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """A compressed ``.npz`` archive of ``arrays`` as bytes, the same for the same arrays."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
    return buf.getvalue()


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Atomically write arrays to a compressed ``.npz`` file (deterministic bytes)."""
    write_atomic(path, npz_bytes(**arrays))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` file, with a clear error when it is missing or broken."""
    if not path.is_file():
        raise ResultsError(f"{path} does not exist.")
    try:
        with path.open("rb") as f, np.load(f, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise ResultsError(f"{path} is corrupted ({type(exc).__name__}: {exc}); delete it, or "
                           "its run folder, to redo that result.") from None


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` and flushes each line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("w")

    def write(self, row: dict[str, Any]) -> None:
        try:
            self._f.write(json.dumps(jsonable(row), allow_nan=False) + "\n")
            self._f.flush()
        except OSError as exc:
            raise named(exc, self.path) from None

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:  # a write that already failed is reported by write
            pass


LEGACY_LOG_KEYS = {"linf": "train_linf"}  # the training log's keys before they were renamed


def read_log(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` training log, one dict per logged step; a torn last line (an
    interrupted write) is dropped. Each row's ``train_linf`` is the training batch's L-infinity
    error (logs written before the rename call it ``linf``, which is read as ``train_linf``)."""
    rows = _read_jsonl(path)
    for row in rows:
        for old, new in LEGACY_LOG_KEYS.items():
            if isinstance(row, dict) and old in row and new not in row:
                row[new] = row.pop(old)
    return rows


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ResultsError(f"{path} does not exist.")
    rows = []
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError:
        raise ResultsError(f"{path} is corrupted (not text).") from None
    for n, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise ResultsError(f"{path} is corrupted at line {n}.") from None
    return rows
