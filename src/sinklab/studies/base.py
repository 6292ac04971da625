"""The Study layer: what every experiment command shares, written once.

A study *declares* what it is: its options (a dataclass, one typed section of the config system),
the training runs it needs (``cells``), how it turns finished runs into records (``collect``),
its claims (``sinklab.claims``), its figures (functions of matplotlib axes) and its report (a
Jinja2 template). ``run_study`` does everything else, the same way for every study:

1. checks the options and the ``--docs`` target before anything is written;
2. claims and locks the output folder (``sinklab.folders``), whose marker names the study, its
   report and its title, so that ``sinklab report`` finds any study's folder without a table;
3. plans the unfinished runs into ensembles and trains them (local processes or Ray), keeping
   every run that finished before, so an interrupted study loses nothing;
4. collects records, decides the claims, draws the figures and renders the report;
5. writes ``records.json`` (options, history, records, claims), ``claims.csv``, one CSV per
   declared table, the report, and with ``--docs FILE`` a copy with its figures.

A study writes only into its own folder. Declaring a ``Study`` and passing it to
``studies.register`` gives it a ``sinklab NAME`` subcommand (``sinklab.cli``) whose options are
generated from the dataclass: ``--seeds 10``, ``--config FILE`` with a ``[NAME]`` table (one file
may hold several studies' tables, e.g. ``docs/studies.toml``), or ``NAME.seeds=10``, later ones
winning.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import platform
import shutil
import sys
import time
import types
import typing
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sinklab import folders, limits
from sinklab.claims import Claim
from sinklab.config import (
    ConfigError,
    RunConfig,
    SinklabError,
    build_run_config,
    check_count,
    coerce,
    read_toml_text,
)
from sinklab.results import ResultsError, read_json, write_atomic, write_json
from sinklab.train import resolve_device, versions

Log = Callable[[str], None]
RECORDS = "records.json"
CLAIMS_CSV = "claims.csv"


# ------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Cell:
    """One training run a study needs, in the folder ``name`` (relative to the study's).

    Cells of the same ``group`` train together as one ensemble, at most ``chunk`` members at a
    time (None: the whole group). A cell named twice (two parts of a study needing the same run)
    is trained once."""

    name: str
    config: RunConfig
    group: tuple[Any, ...] = ()
    label: str = ""
    chunk: int | None = None


@dataclass(frozen=True)
class FigureSpec:
    """A figure of a study: ``draw(axes, records, opts)`` on a fresh grid of axes.

    ``grid`` is (rows, columns) or a function of (records, opts) giving it; ``axes`` is one Axes
    for a 1 x 1 grid, else a 2-D array. ``size`` is inches per panel. ``when`` may leave the
    figure out (e.g. when there is nothing to draw)."""

    name: str
    draw: Callable[[Any, Any, Any], None]
    grid: tuple[int, int] | Callable[[Any, Any], tuple[int, int]] = (1, 1)
    size: tuple[float, float] = (6.0, 4.0)
    title: str | Callable[[Any, Any], str] | None = None
    when: Callable[[Any, Any], bool] | None = None


@dataclass
class Execution:
    """How a study runs (not what it computes): worker processes, device, executor."""

    workers: int | None = None  # None: one process per CPU core (one on a GPU)
    device: str = "auto"
    executor: str = "local"  # or "ray" (sinklab.sweeps.run)
    ray_address: str | None = None

    def __post_init__(self) -> None:
        from sinklab.sweeps.run import check_executor

        if self.workers is not None:
            check_count("--workers", self.workers)
        resolve_device(self.device, "--device")
        check_executor(self.executor, self.ray_address)

    def session(self) -> Any:
        """Ray connected for the study's whole run (before its folder is touched, so that a
        refused connection writes nothing), or nothing to do for the local executor."""
        if self.executor != "ray":
            return nullcontext()
        from sinklab.sweeps.run import ray_session

        return ray_session(self.ray_address, self.workers or os.cpu_count() or 1)


@dataclass
class Context:
    """What ``collect`` sees: the study's folder, options and execution, and a log."""

    study: Study
    out: Path
    opts: Any
    exe: Execution
    log: Log

    def summary(self, name: str) -> dict[str, Any]:
        """The ``summary.json`` of the run in ``name`` (a cell's name)."""
        return read_json(self.out / name / "summary.json")

    def cached(self, key: str, settings: dict[str, Any],
               compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``compute()``'s result, kept in ``cache/KEY.json`` with the settings it depends on:
        a rerun with the same settings reads it back instead of computing it again."""
        path = self.out / "cache" / f"{key}.json"
        if path.is_file():
            kept = read_json(path)
            if isinstance(kept, dict) and kept.get("settings") == settings:
                self.log(f"{self.study.name}: {key}: reused from {path}")
                return kept["result"]
        result = compute()
        write_json(path, {"settings": settings, "result": result})
        return read_json(path)["result"]


def _no_cells(opts: Any, exe: Execution) -> list[Cell]:
    return []


def _no_claims(records: Any, opts: Any) -> list[Claim]:
    return []


@dataclass(frozen=True)
class Study:
    """A study's declaration; ``run_study`` runs it.

    - ``name``: the subcommand, the folder's kind and the options' config table;
    - ``title``: the report's first line (``# title``), by which ``--docs`` recognises a copy;
    - ``options``: a dataclass whose fields are the study's options, each with
      ``metadata={"help": ...}`` (and optionally ``"flag"``, ``"metavar"``); it validates itself
      in ``__post_init__`` and may define ``quick`` handling there;
    - ``cells(opts, exe)``: the runs to train (pure: names and configs, nothing is read);
    - ``collect(ctx)``: records, a dict of JSON-able values, from the finished runs;
    - ``claims(records, opts)``: the report's verdicts, each a ``Claim``;
    - ``figures``: ``FigureSpec``s, drawn into ``figures/NAME.png``;
    - ``template``: a Jinja2 template name (``sinklab/studies/templates``) rendering the report;
    - ``tables``: names of record lists written as ``NAME.csv``;
    - ``bulk``: record entries that only the figures need (attention maps), left out of the
      records copied beside ``--docs FILE``;
    - ``check(opts, exe)``: checks needing more than the options (a model that must exist),
      before anything is written;
    - ``reuse(opts)``: other sinklab folders whose finished runs of the same names and settings
      are adopted before planning (``adopt_runs``), so that they are not trained again.
    """

    name: str
    title: str
    help: str
    description: str
    options: type
    template: str
    collect: Callable[[Context], dict[str, Any]]
    cells: Callable[[Any, Execution], list[Cell]] = _no_cells
    claims: Callable[[Any, Any], list[Claim]] = _no_claims
    figures: tuple[FigureSpec, ...] = ()
    tables: tuple[str, ...] = ()
    bulk: tuple[str, ...] = ()  # record entries only figures need: not in the docs copy
    report: str = "REPORT.md"
    check: Callable[[Any, Execution, Path], None] | None = None
    trains: bool = True  # offers --workers / --executor (studies that train runs)
    reuse: Callable[[Any], Sequence[Path]] | None = None  # folders to adopt finished runs from
    docs_example: str = ""
    default_out: str = ""

    @property
    def heading(self) -> str:
        return f"# {self.title}"

    def marker(self) -> dict[str, Any]:
        """What the folder's marker says about the study (read by ``sinklab report``)."""
        return {"name": self.name, "title": self.title, "report": self.report}


# ------------------------------------------------------------------------------ options


def option_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _hint(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _sequence_item(annotation: Any) -> Any:
    """The item type of ``tuple[X, ...]`` (optionally ``| None``), else None."""
    if isinstance(annotation, types.UnionType):
        args = [a for a in annotation.__args__ if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def coerce_option(study: str, cls: type, name: str, value: Any) -> Any:
    """A TOML value or command-line string turned into the option's type (ConfigError else)."""
    key = f"{study}.{name}"
    annotation = _hint(cls, name)
    item = _sequence_item(annotation)
    if item is not None:
        if isinstance(value, str):
            parts = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            raise ConfigError(f"{key}={value!r} is not allowed: give a list, or values "
                              "separated by commas.")
        return tuple(coerce(key, v, item) for v in parts)
    if annotation in (Path, Path | None):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} is not allowed: it must be a path.")
        return Path(value)
    return coerce(key, value, annotation)


def build_options(study: Study, file: str | None = None, overrides: Sequence[str] = (),
                  flags: dict[str, Any] | None = None) -> Any:
    """The study's options: defaults < ``[NAME]`` table of the TOML ``file`` < ``NAME.KEY=VALUE``
    overrides < command-line flags (``flags``: field name -> value already typed)."""
    cls = study.options
    names = [f.name for f in option_fields(cls)]
    values: dict[str, Any] = {}

    def put(name: str, value: Any, where: str) -> None:
        if name not in names:
            raise ConfigError(f"{where}: {study.name}.{name} is not an option of sinklab "
                              f"{study.name}; its options are "
                              f"{', '.join(f'{study.name}.{n}' for n in names)}.")
        values[name] = coerce_option(study.name, cls, name, value)

    if file is not None:
        from sinklab import studies

        _, table = read_toml_text(file, "config file")
        known = {s.name for s in studies.all_studies()} | {study.name}
        unknown = [k for k in table if k not in known]
        if unknown:  # one file may set several studies' options, each in its own table
            raise ConfigError(f"config file {file!r} has the table [{unknown[0]}], which is not "
                              f"a study's; its tables may be {', '.join(sorted(known))}.")
        section = table.get(study.name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config file {file!r}: {study.name} must be a table of options.")
        for name, value in section.items():
            put(name, value, f"config file {file!r}")
    for item in overrides:
        key, sep, value = item.partition("=")
        prefix, dot, name = key.strip().partition(".")
        if not sep or not dot or prefix != study.name:
            raise ConfigError(f"{item!r} is not an option override: write "
                              f"{study.name}.OPTION=VALUE, for example {study.name}."
                              f"{names[0] if names else 'seeds'}=...")
        put(name, value, "override")
    for name, value in (flags or {}).items():  # flags: strings as typed, lists, or booleans
        if value is None:
            continue
        if name not in names:
            raise ConfigError(f"sinklab {study.name} has no option {name!r}.")
        values[name] = value if isinstance(value, bool) else \
            coerce_option(study.name, cls, name, value)
    try:
        return cls(**values)
    except TypeError as exc:  # a value of the wrong type reaching the dataclass
        raise ConfigError(f"sinklab {study.name}: {exc}.") from None


def options_dict(opts: Any) -> dict[str, Any]:
    """The options as JSON-able values (paths as strings, tuples as lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value

    return {f.name: plain(getattr(opts, f.name)) for f in option_fields(type(opts))}


# ---------------------------------------------------------------------------- planning


@dataclass
class Job:
    """Runs trained together as one ensemble in one process."""

    label: str
    configs: list[RunConfig]
    run_dirs: list[Path]

    @property
    def cost(self) -> float:
        from sinklab.sweeps.run import ensemble_cost

        return ensemble_cost(self.configs[0], len(self.configs))


def is_finished(path: Path, cfg: RunConfig) -> bool:
    """True when ``path`` holds a finished run of ``cfg`` whose files match its completion
    record; a run with other settings, or a missing, truncated or changed file, is an error."""
    if not folders.check_complete(path):
        return False
    if build_run_config(read_json(path / "config.json")) != cfg:
        raise ResultsError(f"{path} holds a run with different settings (for example --quick "
                           "versus the default); use another --out or delete that folder.")
    read_json(path / "summary.json")
    return True


def unique_cells(cells: Sequence[Cell]) -> list[Cell]:
    """The cells by name, each once; one name with two different configs is a bug."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        first = seen.setdefault(cell.name, cell)
        if first.config != cell.config:
            raise RuntimeError(f"the study names {cell.name} twice with different settings")
    return list(seen.values())


def plan(out: Path, cells: Sequence[Cell]) -> tuple[list[Job], int]:
    """The unfinished cells as ensembles, most expensive first, and how many had finished."""
    groups: dict[tuple[Any, ...], list[Cell]] = {}
    done = 0
    for cell in unique_cells(cells):
        if is_finished(out / cell.name, cell.config):
            done += 1
        else:
            groups.setdefault(cell.group, []).append(cell)
    jobs = []
    for group in groups.values():
        chunk = group[0].chunk or len(group)
        for i in range(0, len(group), chunk):
            part = group[i:i + chunk]
            seeds = [c.config.train.seed for c in part]
            seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} runs"
            jobs.append(Job(f"{part[0].label or part[0].name} {seed_text}".strip(),
                            [c.config for c in part], [out / c.name for c in part]))
    jobs.sort(key=lambda j: j.cost, reverse=True)
    return jobs, done


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
        if build_run_config(read_json(src / "config.json")) != cell.config:
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
    steps = [s["steps"] for s in summaries]
    converged = sum(s["converged"] for s in summaries)
    step_text = f"{steps[0]}" if len(steps) == 1 else f"{min(steps)}-{max(steps)}"
    extra = "".join(f"; seed {s['seed']} {s['status']}" for s in summaries
                    if s["status"] == "diverged")
    plateau = sum(s["status"] == "plateau" for s in summaries)
    stops = f", plateau {plateau}/{len(summaries)}" if plateau else ""
    return (f"{job.label}: converged {converged}/{len(summaries)}{stops}, steps {step_text}, "
            f"{seconds:.0f} s{extra}")


def _fitting(job: Job) -> list[Job]:
    """``job`` split into ensembles small enough for the memory limit (refused when one run
    alone is too large)."""
    size = limits.members_that_fit(job.configs[0], len(job.configs), job.label)
    return [Job(job.label, job.configs[i:i + size], job.run_dirs[i:i + size])
            for i in range(0, len(job.configs), size)]


def run_all(jobs: list[Job], workers: int, log: Log, out: Path, exe: Execution,
            origin: str) -> None:
    """Train the jobs through the sweep machinery (``sinklab.sweeps``) on ``exe.executor``:
    workers only compute, this process writes each run folder atomically and records the run
    in the folder's store (``out/sweep.db``, which ``sinklab results`` reads). A job that raised
    is recorded as failed and reported once all jobs are done; rerunning retries it."""
    from sinklab.sweeps.run import code_version, execute
    from sinklab.sweeps.store import Store

    if not jobs:
        return
    jobs = [part for job in jobs for part in _fitting(job)]
    if exe.executor == "local":
        sizes = [limits.run_bytes(job.configs[0], len(job.configs)) for job in jobs]
        fitting = limits.workers_that_fit(sizes, workers, explicit=exe.workers is not None)
        if fitting < min(workers, len(jobs)):
            log(f"{len(jobs)} jobs on {fitting} worker(s): more would not fit in memory "
                f"({limits.MEMORY_ENV})")
        workers = fitting
    store = Store.attach(out, origin=origin)
    version = code_version()
    errors: list[str] = []
    try:
        store.recover()
        names = [[os.path.relpath(p, out) for p in job.run_dirs] for job in jobs]
        store.add_pending([(n, c.to_dict()) for job, ns in zip(jobs, names)
                           for n, c in zip(ns, job.configs)])
        sweep_jobs = [list(zip(ns, (c.to_dict() for c in job.configs)))
                      for job, ns in zip(jobs, names)]
        by_first = {ns[0]: job for job, ns in zip(jobs, names)}
        start = time.perf_counter()
        finished = execute(store, sweep_jobs, exe.executor, workers, exe.ray_address, version)
        for i, (done_job, results, _) in enumerate(finished, start=1):
            errors += [f"{r['name']}: {r['error']}" for r in results if "error" in r]
            summaries = [r["summary"] for r in results if "summary" in r]
            job = by_first[done_job[0][0]]
            log(f"[{i}/{len(jobs)}] {_describe(job, summaries, time.perf_counter() - start)} "
                "(elapsed)")
    finally:
        store.close()
    if errors:
        raise SinklabError(f"{len(errors)} run(s) failed, the first {errors[0]}; the others "
                           "are kept: rerun the same command to retry the failed ones.")


# --------------------------------------------------------------------------------- docs


def check_docs(docs: Path | None, title: str, study: str | None = None) -> None:
    """Refuse a ``--docs FILE`` that sinklab may not write, before any work: FILE must be a
    Markdown file, absent or an earlier copy of the same report (its first line is ``title``),
    the folder of the same name beside it absent or holding figures (PNG files) only, and the
    records beside it (FILE with ``.json``) absent or an earlier copy of this study's."""
    if docs is None:
        return
    docs = Path(docs)
    folder = docs.with_suffix("")
    records = docs.with_suffix(".json")
    if docs.suffix == ".md" and (records.exists() or records.is_symlink()):
        try:
            ours = records.is_file() and not records.is_symlink() and \
                read_json(records)["meta"]["study"] == study
        except (ResultsError, KeyError, TypeError):
            ours = False
        if not ours:
            raise ResultsError(f"--docs {docs}: {records} exists and is not the records of an "
                               f"earlier copy of this report; choose another name.")
    if docs.suffix != ".md":
        raise ResultsError(f"--docs {docs} is not allowed: give a Markdown file name ending in "
                           ".md (its figures go into the folder of the same name).")
    if docs.exists() or docs.is_symlink():
        if not docs.is_file() or docs.is_symlink():
            raise ResultsError(f"--docs {docs} is not a regular file; choose another name.")
        with docs.open("rb") as f:
            first = f.readline().decode("utf-8", "replace").rstrip("\n")
        if first != title:
            raise ResultsError(f"--docs {docs} exists and is not a copy of this report (its first "
                               f"line is not {title!r}); choose another file.")
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or folder.is_symlink():
            raise ResultsError(f"--docs {docs}: {folder} is not a folder; choose another name.")
        others = [p.name for p in folder.iterdir() if p.suffix != ".png" or not p.is_file()]
        if others:
            raise ResultsError(f"--docs {docs}: {folder} holds files that are not figures "
                               f"({', '.join(sorted(others)[:3])}); choose another name.")
    for parent in docs.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ResultsError(f"--docs {docs}: {parent} is a file, not a folder.")
            break


def copy_to_docs(docs: Path, figures: list[Path], text: Callable[[str], str],
                 records: dict[str, Any] | None = None) -> None:
    """Write a report to ``docs`` with its figures copied into a folder of the same name and
    its records (when given) beside it as ``.json``, which tests read to check what README
    quotes.

    ``text(prefix)`` renders the report with figure links starting with ``prefix``. Figures of
    an earlier copy that this report no longer draws are removed (the folder holds figures only,
    as ``check_docs`` made sure)."""
    folder = docs.with_suffix("")
    if records is not None:
        write_json(docs.with_suffix(".json"), records)
    folder.mkdir(parents=True, exist_ok=True)
    names = {fig.name for fig in figures}
    for old in folder.glob("*.png"):
        if old.name not in names:
            old.unlink()
    for fig in figures:
        shutil.copyfile(fig, folder / fig.name)
    write_atomic(docs, text(folder.name).encode())


# ------------------------------------------------------------------------------ outputs


def _csv_value(value: Any) -> Any:
    import json

    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return "" if value is None else value


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of a record table as CSV; columns in first-seen order, nested values as JSON."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return buffer.getvalue()


def draw_figures(study: Study, out: Path, records: Any, opts: Any) -> list[Path]:
    """Every declared figure that applies, into ``out/figures``."""
    from matplotlib.figure import Figure

    from sinklab import plots

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


def _matplotlib_version() -> str:
    import matplotlib

    return matplotlib.__version__


def record_invocation(out: Path, invocation: dict[str, Any]) -> list[dict[str, Any]]:
    """Add a finished invocation to the folder's history in its marker; return the history."""
    marker = folders.read_marker(out) or {}
    history = [*marker.get("invocations", []), invocation]
    folders.update_marker(out, invocations=history)
    return history


def default_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_study(study: Study, out: Path, opts: Any, exe: Execution | None = None, *,
              docs: Path | None = None, command: str | None = None,
              log: Log | None = None) -> dict[str, Any]:
    """Run (or resume) ``study`` into ``out``; return what ``records.json`` holds."""
    from sinklab import studies

    log = log or default_log
    exe = exe or Execution()
    out = Path(out)
    studies.register_kind(study)
    check_docs(docs, study.heading, study.name)
    if study.check is not None:
        study.check(opts, exe, out)
    cells = study.cells(opts, exe)
    limits.check_cells(len(cells), f"sinklab {study.name} with these options")
    with exe.session(), folders.writing(out, study.name, study=study.marker()):
        return _run(study, out, opts, exe, docs, command, log, cells)


def _run(study: Study, out: Path, opts: Any, exe: Execution, docs: Path | None,
         command: str | None, log: Log, cells: list[Cell]) -> dict[str, Any]:
    from sinklab.studies import render

    start = time.perf_counter()
    folders.update_marker(out, study=study.marker())  # a folder of an older sinklab gains it
    device = resolve_device(exe.device)
    for source in study.reuse(opts) if study.reuse is not None else ():
        adopt_runs(out, cells, Path(source), log)
    jobs, done = plan(out, cells)
    workers = worker_count(exe.workers, device, len(jobs))
    n_runs = sum(len(j.configs) for j in jobs)
    if cells:
        log(f"{study.name}: {n_runs} runs to train in {len(jobs)} jobs on {workers} "
            f"worker(s); {done} already finished in {out}")
    run_all(jobs, workers, log, out, exe, origin=study.name)
    train_s = time.perf_counter() - start
    records = study.collect(Context(study, out, opts, exe, log))
    wall = time.perf_counter() - start
    invocation = {
        "command": command or f"sinklab {study.name} --out {out}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, device {device}",
        "workers": workers, "wall_time_s": wall, "train_time_s": train_s,
        "runs_trained": n_runs, "runs_reused": done,
        "versions": {**versions(), "matplotlib": _matplotlib_version()},
    }
    history = record_invocation(out, invocation)
    claims = study.claims(records, opts)
    meta = {**invocation, "study": study.name, "history": history}
    result = {"meta": meta, "options": options_dict(opts), "records": records,
              "claims": [c.to_dict() for c in claims]}
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
                     _without_bulk(result, study.bulk))
    log(f"{study.name}: wrote {out / study.report} ({wall:.0f} s)")
    return result


def _without_bulk(result: dict[str, Any], bulk: Sequence[str]) -> dict[str, Any]:
    records = {k: v for k, v in result["records"].items() if k not in bulk}
    return {**result, "records": records}


def read_records(folder: Path, study: str) -> dict[str, Any]:
    """A finished study folder's ``records.json``, checked to be of ``study``."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        raise ResultsError(f"{folder} {what}; give a folder written by `sinklab {study}`.")
    kind = folders.kind_of(folder)
    if kind != study:
        what = f"a sinklab {folders.describe(kind)}" if kind else "not a sinklab folder"
        raise ResultsError(f"{folder} is {what}, not a folder written by `sinklab {study}`.")
    if not (folder / RECORDS).is_file():
        raise ResultsError(f"{folder} has no {RECORDS} yet (its `sinklab {study}` has not "
                           "finished); run it to the end first.")
    return read_json(folder / RECORDS)
