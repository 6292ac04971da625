"""The folders sinklab writes: whose they are, who is writing them now, and whether a run in
them finished.

- **Marker.** ``sinklab.json`` names a folder's kind (``run``, ``runs``, ``sweep``, ``report``, or
  a study's name: ``reproduce``, ``theory``, ``zoo``, ``extensions``, ``lm``, ...; a study's
  marker also names its report, see ``sinklab.studies``). A command writes only into a folder
  that is absent, empty, or marked with the kind it writes; anything else is refused before a
  byte is written.
  Other files that happen to look like ours (a ``config.json`` in a Hugging Face model folder)
  make no folder sinklab's. A marker that is not valid JSON (``CorruptMarker``) says nothing of
  whose the folder is; its sentence says what gets the folder back (``marker_remedy``: a
  study's next run rebuilds it, a sweep remarks itself from its ``sweep.db``, a run is trained
  again), never just "delete it", which would leave a folder that is not sinklab's.
- **Lock.** A writer holds ``.sinklab.lock`` (an operating-system lock, through ``filelock``)
  for as long as it writes, and names itself in ``.sinklab.lock.json``; a second writer is
  refused with the holder's process id. The system drops the lock when its holder dies, even by
  SIGKILL, so the next writer recovers a stale lock without any clean-up.
- **Completion record.** Once a run has finished, its marker lists every file the run wrote with
  its size and SHA-256, and this record is written last. A finished run is reused only after its
  files are checked against the record (``check_complete``). Figures drawn from those files
  later (``attention.png``, by ``sinklab plot``) are not part of the record.

    with folders.writing(out, "reproduce"):   # claim and lock, or one sentence why not
        ...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from sinklab.errors import ResultsError
from sinklab.runs.files import write_json

MARKER = "sinklab.json"
STORE, STORE_KIND = "sweep.db", "sinklab sweep"  # a sweep's results store (sinklab.sweeps.store)
LOCK = ".sinklab.lock"
HOLDER = ".sinklab.lock.json"
FORMAT = 1
# The kinds of folder that are not a study's; each study adds its own (sinklab.studies.register).
KINDS = {
    "run": "run folder",
    "runs": "folder of seed runs (sinklab train --seeds)",
    "sweep": "sweep folder",
    "report": "report folder",
}
# Entries that may sit in a folder that is otherwise empty: a writer's lock, a sweep database
# left half-created by a killed sweep.
LEFTOVERS = frozenset({LOCK, HOLDER, ".sweep.db.creating"})
# Files drawn from a finished run's results, which ``sinklab plot`` may (re)draw after the run
# was sealed: never in its completion record, and not checked where an older record lists them.
DERIVED = frozenset({"attention.png"})
# Files of a run folder that are not the run's results, so not in its completion record.
NOT_RECORDED = frozenset({MARKER, LOCK, HOLDER}) | DERIVED
RECORDED_DIRS = ("checkpoints",)  # a run's subfolders whose files its record lists too


# What a writer claiming a folder leaves there for a moment: a holder file or a marker still
# being written (``results.temporary_path``: ".NAME.PID.HEX8.tmp"). Seen by a second writer in
# that moment, the folder is one being claimed, not one of someone else's.
_CLAIMING = re.compile(r"\.(" + "|".join(map(re.escape, (HOLDER, MARKER)))
                       + r")\.[0-9]+\.[0-9a-f]{8}\.tmp")


def is_leftover(name: str) -> bool:
    """Whether an entry of an otherwise empty folder leaves it empty for a writer."""
    return name in LEFTOVERS or _CLAIMING.fullmatch(name) is not None


def describe(kind: str) -> str:
    return KINDS.get(kind, f"{kind} folder")


# ---------------------------------------------------------------------------- markers


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The folder's marker, or None when it has none; a marker that is not sinklab's (no known
    kind) is a ResultsError, never taken as a kind."""
    path = Path(folder) / MARKER
    if not path.exists():
        return None
    if not path.is_file():
        raise ResultsError(f"{path} is not a file, so {folder} is not a sinklab folder; choose "
                           "another folder.")
    try:
        marker = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptMarker(Path(folder), str(exc)) from None
    # A study's folder names its study in the marker, so that a folder of a study this process
    # has not loaded (a plugin's) is still recognised as sinklab's.
    if not isinstance(marker, dict) or not isinstance(marker.get("kind"), str) or (
            marker["kind"] not in KINDS and not isinstance(marker.get("study"), dict)):
        found = marker.get("kind") if isinstance(marker, dict) else None
        what = f"names the unknown kind {found!r}" if found is not None else "names no kind"
        raise ResultsError(f"{path} is not sinklab's marker (it {what}), so {folder} is not a "
                           "sinklab folder; choose another folder.")
    if marker.get("format") != FORMAT:
        raise ResultsError(f"{path} has format {marker.get('format')!r}; this sinklab reads "
                           f"format {FORMAT} (a newer or an older sinklab wrote {folder}).")
    return marker


class CorruptMarker(ResultsError):
    """A marker that is not valid JSON: nothing in it says whose the folder is. The message
    says how to get the folder back (``marker_remedy``); a study rebuilds its own folder's
    marker from the finished runs inside (``sinklab.studies.runner``)."""

    def __init__(self, folder: Path, detail: str) -> None:
        super().__init__(f"{folder / MARKER} is corrupted (not valid JSON: {detail}), so "
                         f"sinklab cannot tell what {folder} holds; {marker_remedy(folder)}.")
        self.folder, self.detail = folder, detail


def store_origin(folder: Path) -> str | None:
    """The command that wrote the folder's sweep store (``sweep`` or a study's name), when
    the folder has a readable one of sinklab's (``sinklab.sweeps.store`` writes it)."""
    db = folder / STORE
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro",
                                                uri=True)) as conn:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            conn.execute("SELECT name, status FROM cells LIMIT 1").fetchall()
    except sqlite3.Error:
        return None
    return meta.get("origin") if meta.get("kind") == STORE_KIND else None


def marker_remedy(folder: Path) -> str:
    """What to do about a folder whose marker is corrupted, as a clause; each remedy leads to
    a folder sinklab writes again (deleting the marker alone would leave a folder that is not
    sinklab's, refused for good)."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    origin = store_origin(folder)
    if origin == "sweep":
        return (f"delete {folder / MARKER} and run the sweep again with --out {folder}: it "
                "marks the folder again from its sweep.db")
    if origin is not None:
        return (f"run `sinklab {origin} --out {folder}` again: it rebuilds the marker from the "
                "finished runs inside")
    if names & {"config.json", "metrics.jsonl", "summary.json"}:
        return (f"delete {folder} to train that run again (its completion record was in the "
                "marker)")
    if "REPORT.html" in names and names <= {MARKER, "REPORT.md", "REPORT.html"} | LEFTOVERS:
        return f"delete {folder} and run `sinklab report` again: it holds nothing else"
    return (f"if a sinklab study wrote {folder}, run that study again with --out {folder}: it "
            "rebuilds the marker from the finished runs inside; otherwise choose another folder")


def kind_of(folder: Path) -> str | None:
    """The folder's kind by its marker, or None when it has no marker."""
    marker = read_marker(folder)
    return None if marker is None else marker["kind"]


def check_writable(folder: Path, kind: str, option: str = "--out",
                   ancestors: bool = True) -> None:
    """Raise ResultsError unless ``folder`` may be written as a ``kind`` folder: absent, empty
    (but for a writer's leftovers), or marked with that kind. Writes nothing. With
    ``ancestors`` False the folders above it are not checked: for a study's worker, which
    writes inside the folder that its driver holds."""
    folder = Path(folder)
    if ancestors:
        _check_ancestors(folder, option)
    if not folder.exists():
        if folder.is_symlink():
            raise ResultsError(f"{folder} is a broken symbolic link; choose another {option}.")
        return
    if not folder.is_dir():
        raise ResultsError(f"{folder} is a file, not a folder; choose another {option}.")
    found = kind_of(folder)
    if found is None and not all(is_leftover(p.name) for p in folder.iterdir()):
        # A writer claiming the folder marks it before it writes anything else, so entries
        # listed after a first look found no marker are another writer's only if the marker is
        # there now: look again (two sweeps started together once met this moment).
        found = kind_of(folder)
        if found is None:
            raise ResultsError(f"{folder} exists and is not an empty folder or a sinklab "
                               f"{describe(kind)}; nothing was written; choose another "
                               f"{option}.")
    if found is not None and found != kind:
        raise ResultsError(f"{folder} is a sinklab {describe(found)}, not a {describe(kind)}; "
                           f"choose another {option}.")


def marked_parents(path: Path) -> Iterator[Path]:
    """The folders above ``path`` that hold a ``sinklab.json``, nearest first."""
    for parent in Path(os.path.abspath(path)).parents:
        if (parent / MARKER).is_file():
            yield parent


def _check_ancestors(folder: Path, option: str) -> None:
    """Refuse a folder inside a run folder, or inside a sinklab folder that another process
    is writing (its runs are that process's to write)."""
    for parent in marked_parents(folder):
        try:
            marker = read_marker(parent)
        except ResultsError:
            continue  # not a folder of ours: nothing of ours to protect there
        if marker["kind"] == "run":
            raise ResultsError(f"{folder} is inside the run folder {parent}; choose another "
                               f"{option}.")
        if (parent / LOCK).exists() and _held_elsewhere(parent):
            raise ResultsError(f"{folder} is inside {parent}, which is being written by "
                               f"{_holder_text(parent)}; wait for it to finish or choose "
                               f"another {option}.")


def mark(folder: Path, kind: str, **fields: Any) -> dict[str, Any]:
    """Write a fresh marker of ``kind`` (replacing any earlier one) and return it."""
    marker = {"kind": kind, "format": FORMAT, **fields}
    write_json(Path(folder) / MARKER, marker)
    return marker


def update_marker(folder: Path, **fields: Any) -> dict[str, Any]:
    """Add or replace fields of the folder's marker (which must exist)."""
    marker = read_marker(folder)
    if marker is None:
        raise ResultsError(f"{folder} has no {MARKER}; it is not a sinklab folder.")
    marker.update(fields)
    write_json(Path(folder) / MARKER, marker)
    return marker


# ------------------------------------------------------------------------------ locks


# A writer names itself in its holder file right after it takes the lock; a second writer that
# finds the lock taken waits this long for the name, so that its refusal can give it (with room
# for a loaded machine, where writing and syncing that file can be slow).
HOLDER_WAIT_S = 3.0


def _read_holder(folder: Path) -> tuple[dict[str, Any], int, str] | None:
    try:
        holder = json.loads((folder / HOLDER).read_text())
        return holder, int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holder_text(folder: Path) -> str:
    """Who holds the folder's lock, from its holder file, as a phrase (waiting up to
    ``HOLDER_WAIT_S`` for a writer that has just taken the lock to write it)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while (found := _read_holder(folder)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if found is None:
        return "another sinklab process (it has not recorded its process id yet)"
    holder, pid, host = found
    if pid == os.getpid() and host == socket.gethostname():
        return "this same command (the folder is given twice)"
    command = holder.get("command")
    since = holder.get("since")
    detail = "".join([f", `{command}`" if command else "", f", since {since}" if since else ""])
    where = "" if host == socket.gethostname() else f" on {host}"
    return f"another sinklab process (pid {pid}{where}{detail})"


_HELD: set[str] = set()  # folders whose lock this process holds


def _held_elsewhere(folder: Path) -> bool:
    """Whether another process holds the folder's lock (probed without waiting)."""
    if os.path.abspath(folder) in _HELD:
        return False
    probe = FileLock(str(folder / LOCK), timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    except OSError:  # a lock file we may not open is no lock we can judge
        return False
    probe.release()
    return False


def writer(folder: Path) -> str | None:
    """Who is writing ``folder`` now, as a phrase, or None when no other process is (probed
    without waiting, and without creating a lock file where there is none): for a command that
    only reads the folder."""
    folder = Path(folder)
    if (folder / LOCK).exists() and _held_elsewhere(folder):
        return _holder_text(folder)
    return None


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Hold the folder's writer lock (the folder must exist); refuse with one sentence naming
    the holder when another process has it."""
    folder = Path(folder)
    lock = FileLock(str(folder / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ResultsError(f"{folder} is being written by {_holder_text(folder)}; wait for it "
                           "to finish or stop it, then run this command again.") from None
    key = os.path.abspath(folder)
    _HELD.add(key)
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "command": " ".join(["sinklab", *sys.argv[1:]]) if sys.argv else "sinklab",
                  "since": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}
        write_json(folder / HOLDER, holder)
        yield
    finally:
        _HELD.discard(key)
        try:
            (folder / HOLDER).unlink(missing_ok=True)
        finally:
            lock.release()


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the folders created, outermost first."""
    missing = []
    current = folder
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    created = list(reversed(missing))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # e.g. a name too long at the end of the path: leave no empty parents
        _remove_if_unused([p for p in created if p.is_dir()])
        raise
    return created


def _remove_if_unused(created: list[Path]) -> None:
    """Remove folders this process created when they hold nothing but a marker and locks."""
    for folder in reversed(created):
        try:
            if all(p.name in LEFTOVERS | {MARKER} for p in folder.iterdir()):
                for p in folder.iterdir():
                    p.unlink()
                folder.rmdir()
        except OSError:
            return


@contextmanager
def writing(folder: Path, kind: str, option: str = "--out", **fields: Any) -> Iterator[Path]:
    """Claim ``folder`` as a ``kind`` folder and hold its lock while the body runs.

    The folder is checked before anything is created (``check_writable``), created, locked,
    checked again under the lock, and marked (``fields`` go into a new marker). If the body
    fails before it wrote anything, a folder this call created is removed again.
    """
    folder = Path(folder)
    check_writable(folder, kind, option)
    created = _make_dirs(folder)
    try:
        with hold(folder):
            check_writable(folder, kind, option)  # another writer may have claimed it first
            if read_marker(folder) is None:
                mark(folder, kind, **fields)
            yield folder
    except BaseException:
        _remove_if_unused(created)
        raise


# ---------------------------------------------------------------- completion records


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_files(folder: Path, names: Iterable[str] | None = None) -> dict[str, Any]:
    """Size and SHA-256 of the named files (default: every result file in ``folder``)."""
    folder = Path(folder)
    if names is None:  # top-level result files, and those in RECORDED_DIRS (checkpoints)
        names = sorted(p.name for p in folder.iterdir() if p.is_file()
                       and p.name not in NOT_RECORDED and not p.name.endswith(".tmp"))
        names += sorted(p.relative_to(folder).as_posix() for sub in RECORDED_DIRS
                        if (folder / sub).is_dir() for p in (folder / sub).iterdir()
                        if p.is_file() and not p.name.endswith(".tmp"))
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": _digest(folder / name)}
            for name in names}


def seal(run_dir: Path) -> None:
    """Write the run's completion record: every result file with its size and hash. Called
    after the last of them is written, so a run with a record has all of its files."""
    update_marker(run_dir, complete={
        "files": record_files(run_dir),
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")})


class DamagedRun(ResultsError):
    """A finished run whose files no longer match its completion record."""

    def __init__(self, run_dir: Path, problem: str, corrupt_marker: bool = False) -> None:
        super().__init__(f"{problem}; delete {run_dir} to run it again.")
        self.run_dir, self.problem = run_dir, problem
        self.corrupt_marker = corrupt_marker  # its marker itself is not valid JSON


def check_complete(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run whose files match its completion record.

    False when there is no run yet or it did not finish (no record); ``DamagedRun`` naming the
    file when a recorded file is missing, truncated or changed, or the run has no record but
    looks finished (an older sinklab's, or not sinklab's); a ResultsError when the folder is
    another kind of sinklab folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return False
    try:
        marker = read_marker(run_dir)
    except CorruptMarker:  # the record went with it: the run cannot be checked, only redone
        raise DamagedRun(run_dir, f"{run_dir / MARKER} is corrupted (not valid JSON), so the "
                                  "run's completion record is lost", corrupt_marker=True) from None
    if marker is None:
        if (run_dir / "summary.json").exists():
            raise DamagedRun(run_dir, f"{run_dir} holds a run without a completion record "
                                      "(written by an older sinklab, or not by sinklab)")
        return False
    if marker["kind"] != "run":
        raise ResultsError(f"{run_dir} is a sinklab {describe(marker['kind'])}, not a run "
                           "folder.")
    complete = marker.get("complete")
    if not complete:
        return False
    files = complete.get("files") if isinstance(complete, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(w, dict) and isinstance(w.get("bytes"), int)
            and isinstance(w.get("sha256"), str) for w in files.values()):
        raise DamagedRun(run_dir, f"{run_dir / MARKER} has a malformed completion record")
    for name, want in files.items():
        if name in DERIVED:  # an older sinklab recorded its figure; drawing it again is allowed
            continue
        path = run_dir / name
        if not path.is_file():
            raise DamagedRun(run_dir, f"{path} is missing from a finished run")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise DamagedRun(run_dir, f"{path} is {size} bytes, not the {want['bytes']} it had "
                                      "when the run finished (truncated or changed)")
        if _digest(path) != want["sha256"]:
            raise DamagedRun(run_dir, f"{path} has changed since the run finished (its SHA-256 "
                                      "differs)")
    return True


def finished_runs(path: Path) -> list[Path]:
    """The finished runs ``path`` names: a run folder itself, or each seed run of a
    ``sinklab train --seeds`` folder (seed2 before seed10). Reads only; a missing path, a file, a
    folder that is not sinklab's or is another kind of sinklab folder, one inside a folder that
    another process is writing, and a run that has not finished or is damaged are a ResultsError.
    """
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file, not a folder"
        raise ResultsError(f"{path} {what}; give a run folder written by `sinklab train`.")
    kind = kind_of(path)
    if kind is None:
        raise ResultsError(f"{path} is not a sinklab run folder (it has no {MARKER}); give a "
                           "run folder written by `sinklab train`.")
    if kind not in ("run", "runs"):
        raise ResultsError(f"{path} is a sinklab {describe(kind)}, not a {describe('run')} or "
                           f"a {describe('runs')}.")
    _check_ancestors(path, "run folder")
    if kind == "run":
        runs = [path]
    else:  # seed{s} folders, in the order of their seeds
        runs = sorted((p for p in path.iterdir() if p.is_dir() and (p / MARKER).is_file()),
                      key=lambda p: (len(p.name), p.name))
        if not runs:
            raise ResultsError(f"{path} holds no seed runs yet; nothing to draw.")
    for run in runs:
        if not check_complete(run):
            raise ResultsError(f"{run} holds a run that has not finished (it has no completion "
                               "record), so it has no maps to draw.")
    return runs


def model_digest(path: Any) -> str:
    """The SHA-256 of a finished run's model, from its completion record: what a cached
    evaluation of the model depends on besides its settings (the zoo's and the extensions')."""
    marker = read_marker(path) or {}
    return marker["complete"]["files"]["model.pt"]["sha256"]
