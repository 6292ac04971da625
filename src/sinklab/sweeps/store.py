"""The results store of a sweep: one SQLite database, ``DIR/sweep.db``, beside the run folders.

One row per cell: its status (pending, running, done, failed with a reason), run folder, config,
grid values, summary metrics (every metric of ``sinklab.metrics.METRICS`` that is one number per
run, ``metric_names``), timings, attempts and the code version that ran it; the meta table also
records the plugins whose rules the runs used (``plugins``). Every change is one transaction, so
a killed sweep leaves the database as it was after the last finished cell. Only the process that
drives the sweep writes it; workers only compute.

Run folders are written beside it atomically: into ``.partial-NAME`` next to the final folder
first, then renamed into place. A cell is done when its row says so; at the start of a sweep, rows
left "running" by a killed sweep go back to pending, partial folders are removed, and every done
cell's run folder is checked against its completion record (``verify_done``): a missing,
truncated or changed file sends the cell back to pending.

``sinklab sweep`` folders hold exactly one spec (``create_or_open``). The experiment commands
(``reproduce``, ``theory``, ``zoo``) keep their own folders and attach a store to them
(``attach``), with their run folders' paths as cell names.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sinklab.errors import ResultsError
from sinklab.metrics import METRICS, in_shares
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_atomic
from sinklab.sweeps.spec import Cell, Spec, folder_name

KIND = folders.STORE_KIND
FORMAT = "1"
# In the meta table of a store whose rows hold the sink rates as shares; an older sinklab's
# store, without it, holds them in percent: read as shares, and made shares before a row is
# written (``Store.upgrade_rates``).
SHARES = ("sink_rates", "share")
DB = folders.STORE
STATUSES = ("pending", "running", "done", "failed")


def metric_names() -> list[str]:
    """The metrics a cell's row keeps: every registered metric that is one number per run, read
    from the table when asked, so a metric registered later is stored too."""
    return [name for name, m in METRICS.items() if m.scalar]


def metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The store's summary numbers of a run (``sinklab.sweeps.store.metric_names``), sink rates
    as shares also from a summary an older sinklab wrote (``metrics.in_shares``); a number
    that is missing or not finite (a diverged run's, stored in JSON as null) is None."""
    summary = in_shares(summary)
    values = {key: summary.get(key) for key in metric_names()}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in values.items()}


SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE cells (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    position INTEGER NOT NULL,
    overrides TEXT NOT NULL,
    seed INTEGER NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    reason TEXT,
    metrics TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    started REAL,
    finished REAL,
    seconds REAL,
    code_version TEXT
);
"""


class JunkStore(ResultsError):
    """A ``sweep.db`` that is not a readable sinklab database. In a study's folder the store is
    only an index of the run folders, which hold the results: ``Store.attach`` moves it aside
    and rebuilds it from them. In a ``sinklab sweep`` folder it is the record of the cells, so
    it is refused, and the message says what to do."""

    def __init__(self, folder: Path, problem: str) -> None:
        db = folder / DB
        kind, command = _folder_study(folder)
        if kind is not None:
            again = f"`{command}`" if command else f"the same `sinklab {kind}` command"
            remedy = (f"it only indexes the runs of this {kind} folder, whose run folders hold "
                      f"the results: run {again} again (the same options, --out {folder}), "
                      f"which moves it aside to {DB}.corrupt and rebuilds it from the run "
                      "folders without training any run again")
        else:
            remedy = ("it was the record of this sweep's cells, so the sweep cannot resume from "
                      "it: run the same `sinklab sweep` command with a new --out (every cell "
                      f"trains again there; the run folders in {folder} stay as they are)")
        super().__init__(f"{db} is corrupted or not a sinklab database ({problem}); {remedy}.")
        self.folder, self.problem = folder, problem


def _folder_study(folder: Path) -> tuple[str | None, str | None]:
    """The study whose folder ``folder`` is, by its marker (read leniently: this is for a
    message only), and the last command that wrote it; (None, None) for a sweep folder or one
    whose marker says nothing."""
    try:
        marker = json.loads((folder / folders.MARKER).read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(marker, dict) or not isinstance(marker.get("kind"), str) \
            or marker["kind"] in ("sweep", "run", "runs", "report"):
        return None, None
    history = marker.get("invocations")
    last = history[-1] if isinstance(history, list) and history else {}
    command = last.get("command") if isinstance(last, dict) else None
    return marker["kind"], command if isinstance(command, str) else None


def _finished_rows(root: Path) -> list[tuple[Any, ...]]:
    """Store rows for the finished run folders one level inside ``root``'s folders
    (``runs/X``, ``denied/X``), each checked against its completion record. A run that
    diverged is a failed row with its reason, as ``sinklab.sweeps.run.record`` writes it; a
    damaged or unfinished folder is left out, to the study's planner."""
    rows: list[tuple[Any, ...]] = []
    for top in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                      and not p.name.startswith(".")):
        for run in sorted(p for p in top.iterdir() if p.is_dir() and not p.is_symlink()
                          and not p.name.startswith(".")):
            try:
                if not folders.check_complete(run):
                    continue
                config = read_json(run / "config.json")
                summary = read_json(run / "summary.json")
                seed = int(config["train"]["seed"])
            except (ResultsError, KeyError, TypeError, ValueError):
                continue
            name = run.relative_to(root).as_posix()
            reason = diverged_reason(summary)
            rows.append((name, name, len(rows), seed, json.dumps(config),
                         "failed" if reason else "done", reason,
                         json.dumps(metrics_of(summary)), summary.get("wall_time_s")))
    return rows


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def diverged_reason(summary: dict[str, Any]) -> str | None:
    """The reason a run that diverged is a failed cell (None for a run that did not)."""
    if summary.get("status") != "diverged":
        return None
    return f"diverged at step {summary.get('steps')}: the loss is not finite"


# What a diverged run's numbers still say: how far it got. Its other metrics were measured on
# a model whose loss is not finite (a BOS mass of 3e+10), so they are shown blank.
KEPT_WHEN_DIVERGED = ("converged", "steps", "train_time_s")


def is_diverged(row: dict[str, Any]) -> bool:
    """Whether a cell's row is a run that diverged (failed, with ``diverged_reason``)."""
    return row["status"] == "failed" and (row["reason"] or "").startswith("diverged at step")


def shown_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A row's metrics as ``sinklab results`` shows them and its CSV holds them: a diverged
    run keeps only ``KEPT_WHEN_DIVERGED`` (its reason says at which step it diverged)."""
    metrics = row["metrics"] or {}
    if is_diverged(row):
        return {k: v for k, v in metrics.items() if k in KEPT_WHEN_DIVERGED}
    return metrics


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)  # explicit transactions
    conn.row_factory = sqlite3.Row
    return conn


class Store:
    """A sweep folder's database. ``Store.create_or_open`` for running, ``Store.read`` for
    reading; a folder that is not a sweep folder, or holds another sweep, is refused."""

    def __init__(self, folder: Path, conn: sqlite3.Connection) -> None:
        self.folder, self.conn = folder, conn

    # --------------------------------------------------------------- opening

    @classmethod
    def read(cls, folder: str | Path) -> Store:
        """Open an existing sweep folder (the database must be sinklab's and readable)."""
        folder = Path(folder)
        db = folder / DB
        if not db.is_file():
            raise ResultsError(f"{folder} is not a sweep folder (it has no {DB}).")
        conn = _connect(db)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            conn.execute("SELECT name, status FROM cells LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise JunkStore(folder, str(exc)) from None
        if meta.get("kind") != KIND:
            conn.close()
            raise JunkStore(folder, "its meta table does not name a sinklab sweep")
        if meta.get("format") != FORMAT:
            raise ResultsError(f"{db} has format {meta.get('format')!r}; this sinklab reads "
                               f"format {FORMAT}.")
        return cls(folder, conn)

    @classmethod
    def create_or_open(cls, folder: str | Path, spec: Spec, cells: list[Cell],
                       version: str) -> Store:
        """Open ``folder`` for ``spec``: create it (empty or absent folder), or reopen it when it
        holds this same sweep. Anything else is refused before a byte is written."""
        folder = Path(folder)
        if (folder / DB).exists():
            store = cls.read(folder)
            stored = store.meta().get("spec")
            if stored != spec.to_json():
                raise ResultsError(f"{folder} holds another sweep (its spec differs from "
                                   f"{spec.path}); choose another --out.")
            store.upgrade_rates()
            return store
        # A folder with nothing in it yet but a sweep's marker, its lock or a database left
        # half-created by a killed sweep.
        allowed = folders.LEFTOVERS | {folders.MARKER}
        if folder.exists() and (not folder.is_dir()
                                or any(p.name not in allowed for p in folder.iterdir())):
            raise ResultsError(f"{folder} exists and is not an empty folder or a sinklab sweep "
                               "folder; nothing was written; choose another --out.")
        folder.mkdir(parents=True, exist_ok=True)
        rows = [(c.name, f"runs/{folder_name(c.name)}", c.position, json.dumps(c.overrides),
                 c.seed, json.dumps(c.config.to_dict())) for c in cells]
        return cls._create(folder, {"origin": "sweep", "spec": spec.to_json(),
                                    "spec_path": spec.path, "version": version}, rows)

    @classmethod
    def attach(cls, folder: str | Path, origin: str,
               log: Callable[[str], None] | None = None) -> Store:
        """The store of a study's folder (``origin``: reproduce, theory, zoo, ...), created on
        first use; the folder itself is claimed by the study (its marker file).

        There the store only indexes the run folders, which hold the results and their
        completion records: a store that is not a readable sinklab database is moved aside
        (``sweep.db.corrupt``) and rebuilt from the finished run folders, so no run is trained
        again; ``log`` gets one line saying so."""
        folder = Path(folder)
        if (folder / DB).exists():
            try:
                store = cls.read(folder)
                store.upgrade_rates()
                return store
            except JunkStore as exc:
                problem = exc.problem
            aside = folder / f"{DB}.corrupt"
            write_atomic(aside, (folder / DB).read_bytes())  # kept, in case it is wanted
            finished = _finished_rows(folder)
            store = cls._create(folder, {"origin": origin}, [], finished)  # replaces it at once
            found = len(finished)
            (log or _stderr)(f"{origin}: {folder / DB} was corrupted or not a sinklab database "
                             f"({problem}); moved it to {aside.name} and rebuilt it from the "
                             f"completion records of the {found} finished run(s) in {folder}, "
                             "none of which is trained again")
            return store
        return cls._create(folder, {"origin": origin}, [])

    @classmethod
    def _create(cls, folder: Path, meta: dict[str, str], rows: list[tuple[Any, ...]],
                finished: list[tuple[Any, ...]] = ()) -> Store:
        """A new store in one step: pending ``rows``, and ``finished`` ones (``_finished_rows``)
        of a store rebuilt from its run folders."""
        tmp = folder / f".{DB}.creating"
        tmp.unlink(missing_ok=True)
        conn = _connect(tmp)
        conn.executescript("BEGIN;" + SCHEMA + "COMMIT;")
        with _transaction(conn):
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("kind", KIND), ("format", FORMAT), ("created", str(time.time())), SHARES,
                *meta.items()])
            conn.executemany(
                "INSERT INTO cells (name, path, position, overrides, seed, config, status) "
                "VALUES (?, ?, ?, ?, ?, ?, 'pending')", rows)
            conn.executemany(
                "INSERT INTO cells (name, path, position, overrides, seed, config, status, "
                "reason, metrics, attempts, seconds) "
                "VALUES (?, ?, ?, '{}', ?, ?, ?, ?, ?, 1, ?)", finished)
        conn.close()
        os.replace(tmp, folder / DB)  # the store appears in one step
        return cls.read(folder)

    def add_pending(self, cells: list[tuple[str, dict[str, Any]]]) -> None:
        """Experiment runs about to be trained, (run folder relative to the store, config): new
        rows, or existing rows set back to pending (their folders are not finished)."""
        with _transaction(self.conn):
            start = self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            for i, (name, config) in enumerate(cells):
                self.conn.execute(
                    "INSERT INTO cells (name, path, position, overrides, seed, config, status) "
                    "VALUES (?, ?, ?, '{}', ?, ?, 'pending') ON CONFLICT(name) DO UPDATE SET "
                    "status = 'pending', reason = NULL, config = excluded.config",
                    (name, name, start + i, config["train"]["seed"], json.dumps(config)))

    # --------------------------------------------------------------- reading

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())

    def plugins(self) -> list[str]:
        """The plugins (``sinklab.plugins``) whose rules the folder's runs used: a file's path
        or a module's name each; an unreadable record counts as none."""
        try:
            value = json.loads(self.meta().get("plugins", "[]"))
        except ValueError:
            return []
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every cell as a dict, in sweep order (JSON columns decoded; sink rates as shares,
        also in an older sinklab's store, ``SHARES``)."""
        query = "SELECT * FROM cells" + (" WHERE status = ?" if status else "") + \
            " ORDER BY position"
        out = []
        own = not self.conn.in_transaction
        if own:  # the meta and the rows as one snapshot: a writer may upgrade the rates
            self.conn.execute("BEGIN")
        try:
            percent = self.meta().get(SHARES[0]) != SHARES[1]
            for row in self.conn.execute(query, (status,) if status else ()):
                d = dict(row)
                for key in ("overrides", "config", "metrics"):
                    d[key] = json.loads(d[key]) if d[key] is not None else None
                if percent and d["metrics"]:
                    d["metrics"] = in_shares(d["metrics"])
                out.append(d)
        finally:
            if own:
                self.conn.execute("COMMIT")
        return out

    def upgrade_rates(self) -> None:
        """Make the sink rates of the rows an older sinklab wrote in percent shares, once and
        in one transaction, before this process writes a row of its own (in shares)."""
        if self.meta().get(SHARES[0]) == SHARES[1]:
            return
        with _transaction(self.conn):
            found = self.conn.execute(
                "SELECT name, metrics FROM cells WHERE metrics IS NOT NULL").fetchall()
            for name, text in found:
                values = json.loads(text)
                if values:
                    self.conn.execute("UPDATE cells SET metrics = ? WHERE name = ?",
                                      (json.dumps(in_shares(values)), name))
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", SHARES)

    def counts(self) -> dict[str, int]:
        found = dict(self.conn.execute(
            "SELECT status, COUNT(*) FROM cells GROUP BY status").fetchall())
        return {s: found.get(s, 0) for s in STATUSES}

    # --------------------------------------------------------------- writing

    def record_plugins(self, specs: list[str]) -> None:
        """Add ``specs`` to the plugins the folder records (earlier ones are kept)."""
        recorded = self.plugins()
        merged = recorded + [s for s in specs if s not in recorded]
        if merged != recorded:
            with _transaction(self.conn):
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('plugins', ?)",
                                  (json.dumps(merged),))

    def recover(self, retry_failed: bool = False) -> int:
        """Rows left "running" by a killed sweep (and failed ones, on request) back to pending;
        partial run folders removed. Returns how many rows changed."""
        statuses = ("running", "failed") if retry_failed else ("running",)
        with _transaction(self.conn):
            cur = self.conn.execute(
                f"UPDATE cells SET status = 'pending', reason = NULL WHERE status IN "
                f"({', '.join('?' * len(statuses))})", statuses)
        parents = {self.run_folder(r[0]).parent
                   for r in self.conn.execute("SELECT path FROM cells").fetchall()}
        for parent in parents:
            for partial in parent.glob(".partial-*"):
                shutil.rmtree(partial, ignore_errors=True)
        return cur.rowcount

    def run_folder(self, path: str) -> Path:
        """A cell's run folder; a path that leads out of the sweep folder (an edited
        database) is refused, never written or removed."""
        final = self.folder / path
        inside = os.path.abspath(final).startswith(os.path.abspath(self.folder) + os.sep)
        if os.path.isabs(path) or ".." in Path(path).parts or not inside:
            raise ResultsError(f"{self.folder / DB} names the run folder {path!r}, outside "
                               f"{self.folder}; the database has been edited, so nothing was "
                               "written.")
        return final

    def verify_done(self) -> list[tuple[str, str]]:
        """Done cells whose run folder is missing or does not match its completion record go
        back to pending; returns (cell, what is wrong) for each of them."""
        damaged = []
        for row in self.rows("done"):
            folder = self.run_folder(row["path"])
            try:
                if not folders.check_complete(folder):
                    damaged.append((row["name"], f"{folder} is missing or unfinished"))
            except folders.DamagedRun as exc:
                damaged.append((row["name"], exc.problem))
        if damaged:
            with _transaction(self.conn):
                self.conn.executemany("UPDATE cells SET status = 'pending', reason = NULL "
                                      "WHERE name = ?", [(name,) for name, _ in damaged])
        return damaged

    def mark_running(self, names: list[str]) -> None:
        with _transaction(self.conn):
            self.conn.executemany(
                "UPDATE cells SET status = 'running', attempts = attempts + 1, started = ? "
                "WHERE name = ?", [(time.time(), n) for n in names])

    def finish(self, name: str, *, files: dict[str, bytes] | None, metrics: dict[str, Any],
               failed: str | None, seconds: float, version: str) -> None:
        """Record a cell's outcome: its run folder (renamed into place) and its row, in that
        order, so a row that says done always has its folder."""
        if files is not None:
            (path,) = self.conn.execute("SELECT path FROM cells WHERE name = ?",
                                        (name,)).fetchone()
            final = self.run_folder(path)
            partial = final.parent / f".partial-{final.name}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            for fname, data in files.items():  # names relative to the folder (checkpoints/)
                (partial / fname).parent.mkdir(parents=True, exist_ok=True)
                (partial / fname).write_bytes(data)
            if final.exists():  # a folder from an attempt whose row was never updated
                shutil.rmtree(final)
            os.replace(partial, final)
        with _transaction(self.conn):
            self.conn.execute(
                "UPDATE cells SET status = ?, reason = ?, metrics = ?, finished = ?, "
                "seconds = ?, code_version = ? WHERE name = ?",
                ("failed" if failed else "done", failed, json.dumps(metrics), time.time(),
                 seconds, version, name))

    def export_csv(self, path: Path | None = None) -> Path:
        """Every cell as one CSV row: name, status, reason, grid values, seed, metrics, times
        (a diverged cell's metrics blank but for ``KEPT_WHEN_DIVERGED``, ``shown_metrics``)."""
        path = path or self.folder / "results.csv"
        write_atomic(path, to_csv(self.rows()).encode())
        return path

    def close(self) -> None:
        self.conn.close()


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # a full disk may have ended it already: keep the real error
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def to_csv(rows: list[dict[str, Any]]) -> str:
    grid_keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    fields = ["name", "status", "reason", *grid_keys, "seed", *metric_names(), "attempts",
              "seconds", "code_version"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, **r["overrides"], **shown_metrics(r)})
    return buf.getvalue()
