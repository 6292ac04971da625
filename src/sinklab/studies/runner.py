"""Running a study, the same way for every study (``run_study``):

1. checks the options (each named as it was given: ``sinklab.studies.options.named``) and the
   ``--docs`` target before anything is written;
2. claims and locks the output folder (``sinklab.runs.folders``), whose marker names the study,
   its report and its title, so that ``sinklab report`` finds any study's folder without a
   table (a corrupted marker of the study's own folder is rebuilt first: ``rebuild_marker``);
3. plans the unfinished runs into ensembles and trains them (local processes or Ray), keeping
   every run that finished before, so an interrupted study loses nothing;
4. collects records, decides the claims, draws the figures and renders the report (the study's
   analysis module, imported here once);
5. writes ``records.json`` (options, history, records, claims), ``claims.csv``, one CSV per
   declared table, the report, and with ``--docs FILE`` a copy with its figures, marked as
   sinklab's (``sinklab.studies.outputs.docs_mark``) so that a later ``--docs`` refreshes it and
   nothing else.

A study writes only into its own folder.
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from sinklab import kinds, plots
from sinklab.errors import ResultsError, SinklabError
from sinklab.runs import folders, limits
from sinklab.runs.files import read_json, write_atomic, write_json
from sinklab.studies import reference, render
from sinklab.studies.options import options_dict
from sinklab.studies.outputs import (
    check_docs,
    copy_to_docs,
    default_log,
    record_invocation,
    to_csv,
    without_bulk,
)
from sinklab.studies.study import (
    CLAIMS_CSV,
    RECORDS,
    Cell,
    Context,
    Execution,
    Log,
    Study,
    check_reuse,
    register_kind,
)
from sinklab.sweeps.plan import Job, fitted, jobs_of, plan, sizes, unique_cells
from sinklab.sweeps.run import code_version, execute
from sinklab.sweeps.store import DB, Store
from sinklab.train import resolve_device, versions

# ---------------------------------------------------------------------------- planning


def check_fits(out: Path, cells: Sequence[Cell], exe: Execution) -> None:
    """Refuse, before the folder is touched and anything is printed, a run that does not fit
    in memory alone (``SINKLAB_MAX_MEMORY``) and an explicit ``--workers`` whose jobs, were
    every run still to train, would not fit side by side (as a sweep checks every cell)."""
    jobs = fitted(jobs_of(unique_cells(cells)))
    if exe.executor == "local" and exe.workers is not None:
        limits.workers_that_fit(sizes(jobs), exe.workers, explicit=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the file system allows (sinklab replaces files by renaming, so a link
    is never written through), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def adopt_runs(out: Path, cells: Sequence[Cell], source: Path, log: Log) -> int:
    """Adopt into ``out`` the finished runs of ``source`` that ``cells`` need and ``out`` lacks.

    A run is adopted when ``source`` holds a folder of the cell's name whose files match its
    completion record and whose config equals the cell's (a run with other settings is left
    where it is and trained here). Its marker and recorded files are hard-linked or copied
    into a hidden folder that is then renamed into place, so an interrupted adoption leaves no
    half run. A folder ``out`` already has, finished or not, is left to the planner. Returns
    how many runs were adopted."""
    source = Path(source)
    adopted = other = 0
    for cell in unique_cells(cells):
        dst, src = out / cell.name, source / cell.name
        if dst.exists() or dst.is_symlink() or not src.is_dir():
            continue
        try:
            finished = folders.check_complete(src)
        except ResultsError as exc:
            log(f"--reuse: {src} left out ({exc})")
            continue
        if not finished:
            continue
        if kinds.from_dict(read_json(src / "config.json")) != cell.config:
            other += 1
            continue
        tmp = dst.with_name(f".{dst.name}.adopting")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        shutil.copy2(src / folders.MARKER, tmp / folders.MARKER)  # small, and ours to update
        for name in (folders.read_marker(src) or {})["complete"]["files"]:
            if (src / name).is_file():  # a figure an older sinklab recorded may be absent
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # checkpoints/
                _link_or_copy(src / name, tmp / name)
        os.replace(tmp, dst)
        adopted += 1
    log(f"--reuse {source}: adopted {adopted} finished run(s)"
        + (f"; {other} of the same name have other settings and are trained here" if other
           else ""))
    return adopted


def worker_count(requested: int | None, device: Any, n_jobs: int) -> int:
    """Worker processes: as asked, else one per CPU core (one on a GPU); never more than jobs."""
    workers = requested or (1 if device.type == "cuda" else os.cpu_count() or 1)
    return min(workers, max(n_jobs, 1))


def _describe(job: Job, summaries: list[dict[str, Any]], seconds: float) -> str:
    if not summaries:
        return f"{job.label}: failed, {seconds:.0f} s"
    return f"{job.label}: {kinds.describe(summaries, seconds)}"


def fitting_workers(jobs: Sequence[Job], workers: int, exe: Execution) -> int:
    """The workers that run ``jobs`` (already ``fitted``) side by side: ``workers``, lowered to
    fit in memory for the local executor; an explicit ``--workers`` that does not fit is refused,
    naming the value it was given."""
    if exe.executor != "local":
        return workers
    requested = exe.workers if exe.workers is not None else workers
    return min(workers, limits.workers_that_fit(sizes(jobs), requested,
                                                explicit=exe.workers is not None))


def run_all(jobs: list[Job], workers: int, log: Log, out: Path, exe: Execution,
            origin: str) -> None:
    """Train the jobs through the sweep machinery (``sinklab.sweeps``) on ``exe.executor``:
    workers only compute, this process writes each run folder atomically and records the run
    in the folder's store (``out/sweep.db``, which ``sinklab results`` reads). A job that raised
    is recorded as failed and reported once all jobs are done; rerunning retries it."""
    if not jobs and not (out / DB).exists():
        return  # with a store, open it even so: a junk one is rebuilt (Store.attach)
    jobs = fitted(jobs)
    fitting = fitting_workers(jobs, workers, exe)
    if fitting < min(workers, len(jobs)):  # (a study's round has said so already)
        log(f"{len(jobs)} jobs on {fitting} worker(s): more would not fit in memory "
            f"({limits.MEMORY_ENV})")
    workers = fitting
    store = Store.attach(out, origin=origin, log=log)
    version = code_version()
    errors: list[str] = []
    partial = out / kinds.PARTIAL  # language models in training, resumed from here
    partial.mkdir(exist_ok=True)
    before = os.environ.get(kinds.PARTIAL_ENV)
    os.environ[kinds.PARTIAL_ENV] = str(partial.resolve())  # workers spawn with it
    try:
        store.recover()
        work = [job.work() for job in jobs]
        store.add_pending([item for items in work for item in items])
        by_first = {job.names[0]: job for job in jobs}
        start = time.perf_counter()
        finished = execute(store, work, exe.executor, workers, exe.ray_address, version)
        for i, (done_job, results, _) in enumerate(finished, start=1):
            errors += [f"{r['name']}: {r['error']}" for r in results if "error" in r]
            summaries = [r["summary"] for r in results if "summary" in r]
            job = by_first[done_job[0][0]]
            log(f"[{i}/{len(jobs)}] {_describe(job, summaries, time.perf_counter() - start)} "
                "(elapsed)")
            for r in results:  # recorded: its scratch goes
                if "summary" in r:
                    shutil.rmtree(partial / r["name"], ignore_errors=True)
    finally:
        store.close()
        if before is None:
            os.environ.pop(kinds.PARTIAL_ENV, None)
        else:
            os.environ[kinds.PARTIAL_ENV] = before
        _remove_empty(partial)
    if errors:
        raise SinklabError(f"{len(errors)} run(s) failed, the first {errors[0]}; the others "
                           "are kept: rerun the same command to retry the failed ones.")


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` and the folders in it when no file is left there."""
    if not folder.is_dir():
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()



def draw_figures(study: Study, out: Path, records: Any, opts: Any) -> list[Path]:
    """Every declared figure that applies, into ``out/figures``."""
    paths = []
    for spec in study.figures:
        if spec.when is not None and not spec.when(records, opts):
            continue
        rows, cols = spec.grid(records, opts) if callable(spec.grid) else spec.grid
        fig = Figure(figsize=(spec.size[0] * cols, spec.size[1] * rows))
        axes = fig.subplots(rows, cols, squeeze=False)
        spec.draw(axes[0, 0] if rows == cols == 1 else axes, records, opts)
        if spec.title is not None:
            fig.suptitle(spec.title(records, opts) if callable(spec.title) else spec.title)
        fig.tight_layout()
        path = out / "figures" / f"{spec.name}.png"
        plots.save_figure(fig, path)
        paths.append(path)
    return paths


def matplotlib_version() -> str:
    return matplotlib.__version__


def run_study(study: Study, out: Path, opts: Any, exe: Execution | None = None, *,
              docs: Path | None = None, command: str | None = None,
              log: Log | None = None) -> dict[str, Any]:
    """Run (or resume) ``study`` into ``out``; return what ``records.json`` holds."""
    log = log or default_log
    exe = exe or Execution()
    out = Path(out)
    limits.check_settings()  # a limit that is not allowed: refused before anything else
    register_kind(study)
    check_docs(docs, study.heading, study.name, out)
    if study.check is not None:  # (which names the options as the user gave them)
        study.check(opts, exe, out)
    for source in study.reuse(opts) if study.reuse is not None else ():
        check_reuse(Path(source))
    cells = study.cells(opts, exe)
    limits.check_cells(len(cells), f"sinklab {study.name} with these options")
    check_fits(out, cells, exe)
    with exe.session():
        rebuild_marker(study, out, cells, log)
        with folders.writing(out, study.name, study=study.marker()):
            return _run(study, out, opts, exe, docs, command, log, cells)


def _sinklab_names(study: Study, cells: Sequence[Cell]) -> set[str]:
    """What ``study`` writes at the top of its folder: its outputs, its store and the first
    folder of each run's name (``runs``, ``denied``, ...)."""
    return ({folders.MARKER, f"{folders.MARKER}.corrupt", RECORDS, CLAIMS_CSV, study.report,
             "figures", "cache", "results.csv", DB, f"{DB}.corrupt", f"{DB}-journal"}
            | {f"{t}.csv" for t in study.tables} | {c.name.split("/")[0] for c in cells}
            | set(study.more_folders) | folders.LEFTOVERS)


def _not_rebuildable(study: Study, out: Path, cells: Sequence[Cell]) -> str | None:
    """Why ``out``'s corrupted marker may not be rebuilt as ``study``'s, as a clause with what
    to do instead; None when it may: nothing in ``out`` says another command wrote it, it holds
    nothing ``study`` does not write, and something in it is ``study``'s own (a finished run of
    one of its cells, its records or its store)."""
    origin = folders.store_origin(out)
    if origin is not None and origin != study.name:
        command = "the sweep" if origin == "sweep" else f"`sinklab {origin}`"
        return (f"its sweep.db says {command} wrote {out}, not sinklab {study.name}: run "
                f"{command} with --out {out} to rebuild it")
    try:
        recorded = read_json(out / RECORDS)["meta"]["study"] if (out / RECORDS).is_file() \
            else None
    except (ResultsError, KeyError, TypeError):
        recorded = None
    if recorded is not None and recorded != study.name:
        return (f"its {RECORDS} says `sinklab {recorded}` wrote {out}, not sinklab "
                f"{study.name}: run `sinklab {recorded}` with --out {out} to rebuild it")
    known = _sinklab_names(study, cells)
    foreign = sorted(p.name for p in out.iterdir() if p.name not in known
                     and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    if foreign:
        return (f"{out} also holds {', '.join(foreign[:3])}, which sinklab {study.name} does "
                f"not write, so it is not rebuilt: move {'that' if len(foreign) == 1 else 'them'}"
                f" out of {out} and run this command again, or choose another --out")

    def finished(cell: Cell) -> bool:
        try:
            return folders.check_complete(out / cell.name)
        except ResultsError:
            return False

    if origin == study.name or recorded == study.name or any(map(finished, unique_cells(cells))):
        return None
    return (f"{out} holds nothing of sinklab {study.name} to rebuild it from (no finished run "
            f"of it, no {RECORDS} or sweep.db of it): if another sinklab command wrote {out}, "
            f"run that command with --out {out}; otherwise choose another --out")


def rebuild_marker(study: Study, out: Path, cells: Sequence[Cell], log: Log) -> bool:
    """Rebuild the corrupted marker (``sinklab.json`` that is not valid JSON) of ``study``'s
    folder ``out`` from what sinklab wrote there, so that its finished runs are kept; return
    whether it did.

    The folder is rebuilt only when nothing says another command wrote it and everything in it
    is what ``study`` writes, with at least one thing of its own (``_not_rebuildable``); else
    one sentence says what to do. The corrupted file is kept as ``sinklab.json.corrupt``, the
    history of invocations comes back from ``records.json`` when it is there, and each run
    folder is still checked against its own completion record before it is reused."""
    out = Path(out)
    path = out / folders.MARKER

    def corrupted() -> bool:
        """Whether the marker is corrupted; one sentence when it may not be rebuilt."""
        try:
            folders.check_writable(out, study.name)  # one inside another's is refused first
            return False
        except folders.CorruptMarker as exc:
            why = _not_rebuildable(study, out, cells)
            if why is not None:
                raise ResultsError(f"{path} is corrupted (not valid JSON: {exc.detail}), and "
                                   f"{why}.") from None
            return True

    if not corrupted():  # decided before the lock is taken: a refusal writes nothing
        return False
    with folders.hold(out):
        if not corrupted():  # another process rebuilt it meanwhile
            return False
        write_atomic(out / f"{folders.MARKER}.corrupt", path.read_bytes())
        try:
            records = read_json(out / RECORDS) if (out / RECORDS).is_file() else {}
            history = records["meta"]["history"] if records else []
        except (ResultsError, KeyError, TypeError):
            history = []
        folders.mark(out, study.name, study=study.marker(),
                     **({"invocations": history} if isinstance(history, list) and history
                        else {}))
    log(f"{study.name}: {path} was corrupted (not valid JSON); rebuilt it as sinklab "
        f"{study.name}'s from what is in {out}, keeping the corrupted file as "
        f"{folders.MARKER}.corrupt")
    return True


def _run(study: Study, out: Path, opts: Any, exe: Execution, docs: Path | None,
         command: str | None, log: Log, cells: list[Cell]) -> dict[str, Any]:
    start = time.perf_counter()
    folders.update_marker(out, study=study.marker())  # a folder of an older sinklab gains it
    device = resolve_device(exe.device)
    for source in study.reuse(opts) if study.reuse is not None else ():
        adopt_runs(out, cells, Path(source), log)
    n_runs, done, workers = _train_round(study, out, cells, exe, device, log, first=True)
    n_runs, done = _more_rounds(study, out, opts, exe, log, cells, device, n_runs, done)
    train_s = time.perf_counter() - start
    records = study.completed(study.collect(Context(study, out, opts, exe, log)), opts)
    wall = time.perf_counter() - start
    invocation = {
        "command": command or f"sinklab {study.name} --out {out}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, device {device}",
        "workers": workers, "wall_time_s": wall, "train_time_s": train_s,
        "runs_trained": n_runs, "runs_reused": done,
        "versions": {**versions(), "matplotlib": matplotlib_version()},
    }
    history = record_invocation(out, invocation)
    claims = study.decide(records, opts)
    meta = {**invocation, "study": study.name, "history": history}
    result = {"meta": meta, "options": options_dict(opts), "records": records,
              "claims": [c.to_dict() for c in claims], "reference": reference.records()}
    write_json(out / RECORDS, result)
    write_atomic(out / CLAIMS_CSV, to_csv([c.to_dict() for c in claims]).encode())
    for table in study.tables:
        write_atomic(out / f"{table}.csv", to_csv(records.get(table) or []).encode())
    figures = draw_figures(study, out, records, opts)
    write_atomic(out / study.report,
                 render.report(study, result, claims, opts, "figures").encode())
    if docs is not None:
        copy_to_docs(Path(docs), figures,
                     lambda prefix: render.report(study, result, claims, opts, prefix),
                     without_bulk(result, study.bulk), study.name)
    log(f"{study.name}: wrote {out / study.report} ({wall:.0f} s)")
    return result


def _more_rounds(study: Study, out: Path, opts: Any, exe: Execution, log: Log,
                 cells: list[Cell], device: Any, n_runs: int, done: int) -> tuple[int, int]:
    """Train the rounds of runs that ``study.more_cells`` names from the finished ones, until
    it names no new run; the runs trained and reused, counted with the first round's."""
    if study.more_cells is None:
        return n_runs, done
    planned = {c.name for c in cells}
    tops = {c.name.split("/")[0] for c in cells} | set(study.more_folders)
    while True:
        extra = [c for c in study.more_cells(Context(study, out, opts, exe, log))
                 if c.name not in planned]
        if not extra:
            return n_runs, done
        outside = sorted({c.name.split("/")[0] for c in extra} - tops)
        if outside:
            raise AssertionError(f"{study.name}'s more_cells names runs under {outside}, "
                                 "which neither its cells nor its more_folders use")
        planned |= {c.name for c in extra}
        cells.extend(extra)
        limits.check_cells(len(cells), f"sinklab {study.name} with these options")
        trained, finished, _ = _train_round(study, out, extra, exe, device, log, first=False)
        n_runs, done = n_runs + trained, done + finished


def _train_round(study: Study, out: Path, cells: Sequence[Cell], exe: Execution, device: Any,
                 log: Log, first: bool) -> tuple[int, int, int]:
    """Train the unfinished ``cells`` (one line to ``log`` first, for a later round only when it
    has something to train); the runs trained, those already finished, and the workers."""
    jobs, done = plan(out, cells, log)
    # split to fit in memory and the workers fitted before the plan is printed: a refusal
    # comes first
    jobs = fitted(jobs)
    wanted = worker_count(exe.workers, device, len(jobs))
    workers = fitting_workers(jobs, wanted, exe)
    trained = sum(len(j.configs) for j in jobs)
    if cells and (first or jobs):
        lowered = (f" (more would not fit in memory: {limits.MEMORY_ENV})"
                   if workers < wanted else "")
        log(f"{study.name}: {trained} {'' if first else 'more '}runs to train in {len(jobs)} "
            f"jobs on {workers} worker(s){lowered}; {done} already finished in {out}")
    run_all(jobs, workers, log, out, exe, origin=study.name)
    return trained, done, workers



