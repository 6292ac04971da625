"""The Study layer: what every experiment command shares, written once.

A study *declares* what it is: its options (a dataclass, one typed section of the config system),
the training runs it needs (``cells``), how it turns finished runs into records (``collect``),
its claims (``sinklab.claims``), its figures (functions of matplotlib axes) and its report (a
Jinja2 template). ``run_study`` does everything else, the same way for every study:

1. checks the options (each named as it was given: ``named``) and the ``--docs`` target
   before anything is written;
2. claims and locks the output folder (``sinklab.runs.folders``), whose marker names the study, its
   report and its title, so that ``sinklab report`` finds any study's folder without a table
   (a corrupted marker of the study's own folder is rebuilt first: ``rebuild_marker``);
3. plans the unfinished runs into ensembles and trains them (local processes or Ray), keeping
   every run that finished before, so an interrupted study loses nothing;
4. collects records, decides the claims, draws the figures and renders the report;
5. writes ``records.json`` (options, history, records, claims), ``claims.csv``, one CSV per
   declared table, the report, and with ``--docs FILE`` a copy with its figures, marked as
   sinklab's (``docs_mark``) so that a later ``--docs`` refreshes it and nothing else.

A study writes only into its own folder. Declaring a ``Study`` and passing it to
``studies.register`` gives it a ``sinklab NAME`` subcommand (``sinklab.cli``) whose options are
generated from the dataclass: ``--seeds 10``, ``--config FILE`` with a ``[NAME]`` table (one file
may hold several studies' tables, e.g. ``docs/studies.toml``), or ``NAME.seeds=10``, later ones
winning.
"""

from __future__ import annotations

import contextvars
import csv
import dataclasses
import io
import json
import os
import platform
import re
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

from sinklab import claims as claims_mod
from sinklab.claims import Claim
from sinklab.config import (
    FILE_KINDS,
    check_count,
    coerce,
    file_string_problem,
    read_toml_text,
    toml_text,
)
from sinklab.errors import ConfigError, ResultsError, SinklabError
from sinklab.runs import folders, kinds, limits
from sinklab.runs.files import jsonable, read_json, write_atomic, write_json
from sinklab.studies import reference

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
    config: kinds.Config  # a task run's RunConfig or a language model's PretrainConfig
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
        # torch (the executors train, the device is torch's): not for the help texts
        from sinklab.sweeps.run import check_executor
        from sinklab.train import resolve_device

        if self.workers is not None:
            check_count("--workers", self.workers)
        resolve_device(self.device, "--device")
        check_executor(self.executor, self.ray_address)

    def session(self) -> Any:
        """Ray connected for the study's whole run (before its folder is touched, so that a
        refused connection writes nothing), or nothing to do for the local executor."""
        if self.executor != "ray":
            return nullcontext()
        from sinklab.sweeps.run import ray_session  # torch and ray: not for the help texts

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
        kept = read_kept(path, settings, "result")
        if kept is not None:
            self.log(f"{self.study.name}: {key}: reused from {path}")
            return kept
        result = compute()
        write_json(path, {"settings": settings, "result": result})
        return read_json(path)["result"]

    def stages(self, key: str, settings: dict[str, Any]) -> Stages:
        """The finished stages of a long computation of ``key`` (``cache/KEY.partial.json``,
        with the settings it depends on), so that a computation interrupted or failed halfway
        resumes from its last finished stage; ``Stages.finish`` removes them once the whole
        result is kept (``cached``)."""
        return Stages(self.out / "cache" / f"{key}.partial.json", settings)


def read_kept(path: Path, settings: dict[str, Any], field: str) -> Any:
    """The ``field`` of a file of kept results (``{"settings": ..., field: ...}``) when it was
    kept with these ``settings``; None when there is no such file, it was kept with other
    settings, or it is damaged (then it is computed again, not trusted)."""
    try:
        kept = read_json(path) if path.is_file() else None
    except ResultsError:
        return None
    if isinstance(kept, dict) and kept.get("settings") == settings:
        return kept.get(field)
    return None


class Stages:
    """Stage results kept on disk as each finishes: ``keep(name, compute)`` gives a kept stage
    (kept with the same settings), or computes it, keeps it (the file is rewritten atomically)
    and returns it as it reads back (non-finite numbers become None, as in every record)."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path, self.settings = path, settings
        kept = read_kept(path, settings, "stages")
        self.done: dict[str, Any] = kept if isinstance(kept, dict) else {}

    def keep(self, name: str, compute: Callable[[], Any]) -> Any:
        if name not in self.done:
            self.done[name] = compute()
            write_json(self.path, {"settings": self.settings, "stages": self.done})
            self.done = read_json(self.path)["stages"]
        return self.done[name]

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


def _no_cells(opts: Any, exe: Execution) -> list[Cell]:
    return []


def _no_claims(records: Any, opts: Any) -> list[Claim]:
    return []


@dataclass(frozen=True)
class Study:
    """A study's declaration; ``run_study`` runs it.

    - ``name``: the subcommand, the folder's kind and the options' config table;
    - ``title``: the report's first line (``# title``);
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
      are adopted before planning (``adopt_runs``), so that they are not trained again;
    - ``more_cells(ctx)``: runs that depend on finished ones (a learning-rate search's next
      rate, fresh seeds at the rate it found), asked for after each round of training until it
      names none that is not planned yet (rounds; a resumed study replays them from its finished
      runs), under the top folders of ``cells`` or those declared in ``more_folders``.
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
    # the keys of the study's primary claims, named before it runs: corrected together by Holm
    primary: tuple[str, ...] = ()
    # records a claim's control needs that are cheap to compute from the options alone (an
    # untrained model's measurements): added to records that lack them, by a run and by
    # `sinklab render`, and returned as the records completed
    complete: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    more_cells: Callable[[Context], list[Cell]] | None = None
    more_folders: tuple[str, ...] = ()  # the first folder of every cell more_cells names

    @property
    def heading(self) -> str:
        return f"# {self.title}"

    def completed(self, records: dict[str, Any], opts: Any) -> dict[str, Any]:
        """The records with what ``complete`` adds (the records as they are without one)."""
        return records if self.complete is None else self.complete(records, opts)

    def decide(self, records: Any, opts: Any) -> list[Claim]:
        """The report's claims decided together (``claims.finalize``): the primary claims
        corrected by Holm, the other empirical claims by Benjamini-Hochberg."""
        return claims_mod.finalize(self.claims(records, opts), self.primary)

    def marker(self) -> dict[str, Any]:
        """What the folder's marker says about the study (read by ``sinklab report``)."""
        return {"name": self.name, "title": self.title, "report": self.report}


# ------------------------------------------------------------------------------ registry

STUDIES: dict[str, Study] = {}


def register_kind(study: Study) -> None:
    """Let the folders module know the study's folder kind."""
    folders.KINDS.setdefault(study.name, f"{study.name} folder")


def register(study: Study) -> Study:
    """Add ``study`` (its name must be new; ``sinklab.cli`` refuses one named like its own
    commands)."""
    if study.name in STUDIES:
        raise ValueError(f"a study or command named {study.name!r} exists already")
    STUDIES[study.name] = study
    register_kind(study)
    return study


def unregister(name: str) -> None:
    """Remove a study added by ``register`` (tests declare their own)."""
    STUDIES.pop(name, None)


def all_studies() -> list[Study]:
    """Every registered study, sinklab's own first, in the order the gathered report uses."""
    return list(STUDIES.values())


def get(name: str) -> Study:
    return STUDIES[name]


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


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of the option ``name``: its field's ``metadata["flag"]``, else
    ``--name-with-dashes``."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("flag", "--" + name.replace("_", "-"))
    return "--" + name.replace("_", "-")


# How each option of the options class being built was given: (class, field -> name as given).
_GIVEN: contextvars.ContextVar[tuple[type, dict[str, str]] | None] = contextvars.ContextVar(
    "sinklab_options_given", default=None)


GIVEN_ATTR = "_sinklab_given"  # the options' sources, kept on the built options


def named(opts: Any, name: str) -> str:
    """The option ``name`` of ``opts`` (an options dataclass or an instance of it) as the user
    gave it, for a message: the flag (``--tokens``) for a flag or a default, ``lm.n_tokens`` for
    an override ``lm.n_tokens=...``, ``config file 'x.toml': [lm] n_tokens`` for a config file's
    table. ``build_options`` records the sources; an options class's ``__post_init__`` names
    every option it refuses through this, e.g. ``f"{named(self, 'n_tokens')}={value!r} is not
    allowed"``."""
    cls = opts if isinstance(opts, type) else type(opts)
    given = _GIVEN.get()
    if given is not None and given[0] is cls and name in given[1]:
        return given[1][name]
    kept = getattr(opts, GIVEN_ATTR, None) if not isinstance(opts, type) else None
    if isinstance(kept, dict) and name in kept:
        return kept[name]
    return flag_of(cls, name)


def _as_given(message: str, cls: type, given: dict[str, str]) -> str:
    """A refusal that names an option by its flag (a study whose checks do not use ``named``)
    rewritten to name it as it was given."""
    for name, where in given.items():
        flag = flag_of(cls, name)
        if where != flag and re.match(re.escape(flag) + r"(?![\w-])", message):
            return where + message[len(flag):]
    return message


def coerce_option(study: str, cls: type, name: str, value: Any, key: str | None = None) -> Any:
    """A TOML value or command-line string turned into the option's type (ConfigError else,
    naming the option as ``key``, how it was given; default ``STUDY.NAME``)."""
    return coerce_typed(key or f"{study}.{name}", value, _hint(cls, name))


def coerce_typed(key: str, value: Any, annotation: Any) -> Any:
    """``value`` turned into the type ``annotation`` (``coerce_option``)."""
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


FILE_LISTS = {int: "integers", float: "numbers", bool: "booleans (true or false)"}


def typed_value(key: str, name: str, value: Any, annotation: Any, source: str) -> None:
    """Refuse a string where the option takes a number or a boolean, in a file whose values are
    typed (TOML, JSON): there ``"5"`` is text, not a number, and ``"yes"`` no boolean, as for a
    run's settings (``config.file_string_problem``). ``key`` names the option as given;
    ``source`` is ``"toml"`` (the refusal says what to write) or ``"json"`` (a file sinklab
    wrote). A command line's strings are parsed instead (``coerce_option``)."""
    item = _sequence_item(annotation)
    if item is None:
        problem = file_string_problem(name, value, annotation)
        if problem is None:
            return
        how = "is a string"
        if source == "json":
            kind = next(a for a in typing.get_args(annotation) or (annotation,)
                        if a is not type(None))
            raise ConfigError(f"{key}={value!r} is not allowed: it must be {FILE_KINDS[kind]}, "
                              "not a string.")
    else:
        if isinstance(value, str):
            texts, how = [value], "is a string"
        elif isinstance(value, (list, tuple)):
            texts, how = [v for v in value if isinstance(v, str)], "holds a string"
        else:
            return  # neither: coerce_typed refuses it
        if all(file_string_problem(name, v, item) is None for v in texts):
            return
        if source == "json":
            raise ConfigError(f"{key}={value!r} is not allowed: it must be a list of "
                              f"{FILE_LISTS[item]}, not a string.")
        try:
            typed = coerce_typed(key, value, annotation)
            problem = (f"write a list of {FILE_LISTS[item]}: {name} = "
                       f"[{', '.join(toml_text(v) for v in typed)}]")
        except ConfigError:
            problem = f"write a list of {FILE_LISTS[item]} without quotes"
    raise ConfigError(f"{key} = {value!r} {how}; {problem}.")


def build_options(study: Study, file: str | None = None, overrides: Sequence[str] = (),
                  flags: dict[str, Any] | None = None) -> Any:
    """The study's options: defaults < ``[NAME]`` table of the TOML ``file`` < ``NAME.KEY=VALUE``
    overrides < command-line flags (``flags``: field name -> value already typed)."""
    cls = study.options
    names = [f.name for f in option_fields(cls)]
    values: dict[str, Any] = {}
    given: dict[str, str] = {}  # each option as the user gave it, for messages (``named``)

    def put(name: str, value: Any, where: str, key: str, typed: bool) -> None:
        if name not in names:
            raise ConfigError(f"{where}: {study.name}.{name} is not an option of sinklab "
                              f"{study.name}; its options are "
                              f"{', '.join(f'{study.name}.{n}' for n in names)}.")
        given[name] = key
        if typed:  # a TOML file's values are typed: "5" is no number there, "yes" no boolean
            typed_value(key, name, value, _hint(cls, name), "toml")
        values[name] = coerce_option(study.name, cls, name, value, key)

    if file is not None:
        _, table = read_toml_text(file, "config file")
        known = {s.name for s in all_studies()} | {study.name}
        unknown = [k for k in table if k not in known]
        if unknown:  # one file may set several studies' options, each in its own table
            raise ConfigError(f"config file {file!r} has the table [{unknown[0]}], which is not "
                              f"a study's; its tables may be {', '.join(sorted(known))}.")
        section = table.get(study.name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config file {file!r}: {study.name} must be a table of options.")
        for name, value in section.items():
            put(name, value, f"config file {file!r}",
                f"config file {file!r}: [{study.name}] {name}", typed=True)
    for item in overrides:
        key, sep, value = item.partition("=")
        prefix, dot, name = key.strip().partition(".")
        if not sep or not dot or prefix != study.name:
            raise ConfigError(f"{item!r} is not an option override: write "
                              f"{study.name}.OPTION=VALUE, for example {study.name}."
                              f"{names[0] if names else 'seeds'}=...")
        put(name, value, "override", f"{study.name}.{name.strip()}", typed=False)
    for name, value in (flags or {}).items():  # flags: strings as typed, lists, or booleans
        if value is None:
            continue
        if name not in names:
            raise ConfigError(f"sinklab {study.name} has no option {name!r}.")
        given[name] = flag_of(cls, name)
        values[name] = value if isinstance(value, bool) else \
            coerce_option(study.name, cls, name, value, given[name])
    token = _GIVEN.set((cls, given))
    try:
        opts = cls(**values)
        # kept for the checks that run after the options are built (a study's ``check``)
        object.__setattr__(opts, GIVEN_ATTR, dict(given))
        return opts
    except TypeError as exc:  # a value of the wrong type reaching the dataclass
        raise ConfigError(f"sinklab {study.name}: {exc}.") from None
    except ConfigError as exc:
        raise ConfigError(_as_given(str(exc), cls, given)) from None
    finally:
        _GIVEN.reset(token)


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
    configs: list[kinds.Config]
    run_dirs: list[Path]

    @property
    def cost(self) -> float:
        return kinds.cost(self.configs[0], len(self.configs))


def is_finished(path: Path, cfg: kinds.Config) -> bool:
    """True when ``path`` holds a finished run of ``cfg`` whose files match its completion
    record; a run with other settings, or a missing, truncated or changed file, is an error."""
    if not folders.check_complete(path):
        return False
    if kinds.from_dict(read_json(path / "config.json")) != cfg:
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


def plan(out: Path, cells: Sequence[Cell], log: Log | None = None) -> tuple[list[Job], int]:
    """The unfinished cells as ensembles, most expensive first, and how many had finished.

    A run whose marker is corrupted has lost its completion record, so it cannot be checked:
    it is trained again (its folder replaced once the new run is done), with a line to ``log``.
    """
    pending, done = [], 0
    for cell in unique_cells(cells):
        try:
            finished = is_finished(out / cell.name, cell.config)
        except folders.DamagedRun as exc:
            if not exc.corrupt_marker:
                raise
            (log or default_log)(f"{exc.problem}; it is trained again")
            finished = False
        if finished:
            done += 1
        else:
            pending.append(cell)
    return jobs_of(out, pending), done


def jobs_of(out: Path, cells: Sequence[Cell]) -> list[Job]:
    """``cells`` as ensembles (by group, at most ``chunk`` members), most expensive first."""
    from sinklab.sweeps.run import ensembles  # torch: not for the help texts

    jobs = []
    for part in ensembles(list(cells), lambda c: c.group, lambda g: g[0].chunk or len(g)):
        seeds = [c.config.train.seed for c in part]
        seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} runs"
        jobs.append(Job(f"{part[0].label or part[0].name} {seed_text}".strip(),
                        [c.config for c in part], [out / c.name for c in part]))
    jobs.sort(key=lambda j: j.cost, reverse=True)
    return jobs


def check_fits(out: Path, cells: Sequence[Cell], exe: Execution) -> None:
    """Refuse, before the folder is touched and anything is printed, a run that does not fit
    in memory alone (``SINKLAB_MAX_MEMORY``) and an explicit ``--workers`` whose jobs, were
    every run still to train, would not fit side by side (as a sweep checks every cell)."""
    jobs = fitted(jobs_of(out, unique_cells(cells)))
    if exe.executor == "local" and exe.workers is not None:
        limits.workers_that_fit(job_sizes(jobs), exe.workers, explicit=True)


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


STUDY_FREE_KINDS = ("run", "runs", "sweep", "report")  # sinklab's kinds that are no study's


def check_reuse(source: Path, option: str = "--reuse") -> None:
    """Refuse a folder to adopt finished runs from (``adopt_runs``) that is not a sinklab
    study's folder, in one sentence, before anything is written: a folder that is not
    sinklab's would adopt nothing and leave every run to train, without a word."""
    source = Path(source)
    if not source.is_dir():
        what = "does not exist" if not source.exists() else "is not a folder"
        raise ResultsError(f"{option} {source} {what}; give the folder of a sinklab study (a zoo "
                           "or extensions --out folder) whose finished runs to adopt.")
    marker = folders.read_marker(source)  # a marker that is not sinklab's: one sentence
    if marker is None:
        raise ResultsError(f"{option} {source} is not a sinklab folder (it has no "
                           f"{folders.MARKER}), so it holds no finished runs to adopt; give the "
                           "folder of a sinklab study (a zoo or extensions --out folder).")
    if marker["kind"] in STUDY_FREE_KINDS:
        raise ResultsError(f"{option} {source} is a sinklab {folders.describe(marker['kind'])}, "
                           "not a study's folder; give the folder of a sinklab study (a zoo or "
                           "extensions --out folder).")


def worker_count(requested: int | None, device: Any, n_jobs: int) -> int:
    """Worker processes: as asked, else one per CPU core (one on a GPU); never more than jobs."""
    workers = requested or (1 if device.type == "cuda" else os.cpu_count() or 1)
    return min(workers, max(n_jobs, 1))


def _describe(job: Job, summaries: list[dict[str, Any]], seconds: float) -> str:
    if not summaries:
        return f"{job.label}: failed, {seconds:.0f} s"
    return f"{job.label}: {kinds.describe(summaries, seconds)}"


def _fitting(job: Job) -> list[Job]:
    """``job`` split into ensembles small enough for the memory limit (refused when one run
    alone is too large)."""
    size = kinds.members_that_fit(job.configs[0], len(job.configs), job.label)
    return [Job(job.label, job.configs[i:i + size], job.run_dirs[i:i + size])
            for i in range(0, len(job.configs), size)]


def fitted(jobs: Sequence[Job]) -> list[Job]:
    """Every job split into ensembles that fit in memory (``_fitting``)."""
    return [part for job in jobs for part in _fitting(job)]


def job_sizes(jobs: Sequence[Job]) -> list[int]:
    """The memory each job needs (``kinds.run_bytes``)."""
    return [kinds.run_bytes(job.configs[0], len(job.configs)) for job in jobs]


def fitting_workers(jobs: Sequence[Job], workers: int, exe: Execution) -> int:
    """The workers that run ``jobs`` (already ``fitted``) side by side: ``workers``, lowered to
    fit in memory for the local executor; an explicit ``--workers`` that does not fit is refused,
    naming the value it was given."""
    if exe.executor != "local":
        return workers
    requested = exe.workers if exe.workers is not None else workers
    return min(workers, limits.workers_that_fit(job_sizes(jobs), requested,
                                                explicit=exe.workers is not None))


def run_all(jobs: list[Job], workers: int, log: Log, out: Path, exe: Execution,
            origin: str) -> None:
    """Train the jobs through the sweep machinery (``sinklab.sweeps``) on ``exe.executor``:
    workers only compute, this process writes each run folder atomically and records the run
    in the folder's store (``out/sweep.db``, which ``sinklab results`` reads). A job that raised
    is recorded as failed and reported once all jobs are done; rerunning retries it."""
    # torch: the executors train; not for the help texts
    from sinklab.sweeps.run import code_version, execute
    from sinklab.sweeps.store import DB, Store

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


# --------------------------------------------------------------------------------- docs


DOCS_MARK = "<!-- written by sinklab {study}: records in {records} -->"
_DOCS_MARK = re.compile(r"<!-- written by sinklab (\S+): records in .* -->")


def docs_mark(study: str, docs: Path) -> str:
    """The line that marks ``docs`` as sinklab's copy of ``study``'s report: an HTML comment,
    invisible where the Markdown is rendered, written as the copy's last line."""
    return DOCS_MARK.format(study=study, records=Path(docs).with_suffix(".json").name)


def _marked_study(docs: Path) -> str | None:
    """The study whose mark ``docs`` carries (``docs_mark``), or None when it has none."""
    text = docs.read_bytes().decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if (match := _DOCS_MARK.fullmatch(line.strip())) is not None:
            return match.group(1)
    return None


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (by absolute paths, links not
    followed)."""
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_docs(docs: Path | None, title: str, study: str | None = None,
               out: Path | None = None) -> None:
    """Refuse a ``--docs FILE`` that sinklab may not write, before any work.

    FILE must be a Markdown file outside every sinklab folder (a run, a study's folder, the
    study's own ``out``, ...: their files are the folder's own), and absent or sinklab's earlier
    copy of this study's report, recognised by what sinklab wrote, never by the title alone:
    the mark ``docs_mark`` in the file, or (a copy written before there was a mark) this
    study's records beside it (FILE with ``.json``) with the report's ``title`` as the file's
    first line. The records beside it must be absent or this study's, and the folder of the
    same name absent or holding figures (PNG files) only."""
    if docs is None:
        return
    docs = Path(docs)
    folder = docs.with_suffix("")
    records = docs.with_suffix(".json")
    if docs.suffix != ".md":
        raise ResultsError(f"--docs {docs} is not allowed: give a Markdown file name ending in "
                           ".md (its figures go into the folder of the same name).")
    if out is not None and _inside(docs, out):
        raise ResultsError(f"--docs {docs} is inside the --out folder {out}, whose files are the "
                           "study's own; give a file outside it.")
    if out is not None and _inside(out, folder):
        which = "is" if _inside(folder, out) else "holds"
        raise ResultsError(f"--docs {docs} would put its figures into {folder}, which {which} "
                           f"the --out folder {out}; choose another name.")
    parent = next(folders.marked_parents(docs), None)
    if parent is not None:
        raise ResultsError(f"--docs {docs} is inside the sinklab folder {parent}, whose files "
                           "are sinklab's own; give a file outside it.")
    if (folder / folders.MARKER).exists():
        raise ResultsError(f"--docs {docs} would put its figures into {folder}, which is a "
                           "sinklab folder; choose another name.")
    ours = False  # records beside FILE that are this study's
    if records.exists() or records.is_symlink():
        try:
            ours = records.is_file() and not records.is_symlink() and \
                read_json(records)["meta"]["study"] == study
        except (ResultsError, KeyError, TypeError):
            ours = False
        if not ours:
            raise ResultsError(f"--docs {docs}: {records} exists and is not the records of an "
                               f"earlier copy of this report; choose another name.")
    if docs.exists() or docs.is_symlink():
        if not docs.is_file() or docs.is_symlink():
            raise ResultsError(f"--docs {docs} is not a regular file; choose another name.")
        marked = _marked_study(docs)
        if marked is not None and marked != study:
            raise ResultsError(f"--docs {docs} is sinklab's copy of the report of sinklab "
                               f"{marked}, not of sinklab {study}; choose another file.")
        with docs.open("rb") as f:
            first = f.readline().decode("utf-8", "replace").rstrip("\r\n")
        if marked is None and not (ours and first == title):
            why = ("it has no sinklab mark, and its first line is not the report's title, though "
                   "the records beside it are this study's") if ours else \
                "it has neither sinklab's mark nor this study's records beside it"
            raise ResultsError(f"--docs {docs} exists and is not a copy of this report that "
                               f"sinklab wrote ({why}); choose another file.")
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or folder.is_symlink():
            raise ResultsError(f"--docs {docs}: {folder} is not a folder; choose another name.")
        others = [p.name for p in folder.iterdir() if p.suffix != ".png" or not p.is_file()]
        if others:
            raise ResultsError(f"--docs {docs}: {folder} holds files that are not figures "
                               f"({', '.join(sorted(others)[:3])}); choose another name.")
    for above in docs.parents:
        if above.exists():
            if not above.is_dir():
                raise ResultsError(f"--docs {docs}: {above} is a file, not a folder.")
            break


def copy_to_docs(docs: Path, figures: list[Path], text: Callable[[str], str],
                 records: dict[str, Any] | None = None, study: str | None = None) -> None:
    """Write a report to ``docs`` with its figures copied into a folder of the same name and
    its records (when given) beside it as ``.json``, which tests read to check what README
    quotes; with ``study``, the report ends with the mark (``docs_mark``) by which a later
    ``--docs`` knows the file for sinklab's copy.

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
    report = text(folder.name)
    if study is not None:
        report = report.rstrip("\n") + "\n\n" + docs_mark(study, docs) + "\n"
    write_atomic(docs, report.encode())


def options_from(study: Study, values: dict[str, Any], where: str = "options") -> Any:
    """The study's options from what ``options_dict`` wrote (a report's records), checked again
    by the options' own ``__post_init__``; a value that is not allowed is named as the records'
    own (``where``, e.g. ``docs/zoo.json: options``, then ``.seeds``), not as a flag."""
    cls = study.options
    given = {f.name: f"{where}.{f.name}" for f in option_fields(cls)}
    kwargs = {}
    for f in option_fields(cls):
        if f.name not in values:  # an option newer than the records: its default
            continue
        hint = _hint(cls, f.name)
        typed_value(given[f.name], f.name, values[f.name], hint, "json")
        kwargs[f.name] = coerce_typed(given[f.name], values[f.name], hint)
    token = _GIVEN.set((cls, given))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(_as_given(str(exc), cls, given)) from None
    finally:
        _GIVEN.reset(token)


# What ``run_study`` writes into records.json, which a report's records must hold to be rendered.
RESULT_FIELDS: dict[str, tuple[type, str]] = {
    "meta": (dict, "an object"), "options": (dict, "an object"),
    "records": (dict, "an object"), "claims": (list, "an array")}


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'an object', 'an array', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, words in ((dict, "an object"), (list, "an array"), (str, "a string")):
        if isinstance(value, kind):
            return words
    return "a number"


def result_problem(result: Any) -> str | None:
    """Why ``result`` (a records file's JSON) is not what ``run_study`` writes, as a clause;
    None when it has the fields every study's report needs, of the right kinds."""
    def listed(keys: Sequence[str]) -> str:
        names = [repr(k) for k in keys]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    fields = listed(list(RESULT_FIELDS))
    if not isinstance(result, dict):
        return f"it holds {_json_kind(result)}, not an object with {fields}"
    missing = [k for k in RESULT_FIELDS if k not in result]
    if missing:
        return f"it lacks {listed(missing)} (sinklab's records hold {fields})"
    for key, (kind, words) in RESULT_FIELDS.items():
        if not isinstance(result[key], kind):
            return f"its {key!r} is {_json_kind(result[key])}, not {words}"
    if not isinstance(result["meta"].get("study"), str):
        return "its meta names no study"
    if not isinstance(result["meta"].get("history"), list):
        return "its meta has no history of the commands that wrote it"
    return None


def _report_of(docs: Path) -> tuple[str | None, bool]:
    """The study whose report ``docs`` is by its mark (``docs_mark``), else by its first line
    (a copy written before there was a mark), and whether it carries the mark."""
    marked = _marked_study(docs)
    if marked is not None:
        return marked, True
    first = docs.read_bytes().decode("utf-8", "replace").split("\n", 1)[0].strip()
    return next((s.name for s in STUDIES.values() if s.heading == first), None), False


def render_docs(docs: Path) -> tuple[str, bool]:
    """Write the report ``docs`` (a ``--docs`` copy, known by its mark or its study's heading)
    again from the records beside it (``docs_mark``), after its template or its claims' code
    changed: nothing is trained and its figures are left as they are; the study's ``complete``
    adds what it adds, and the claims decided again are written into the records too. Returns
    the study's name, and whether those claims are the ones recorded with them.

    The records are checked before they are used: a file that is not records ``run_study``
    wrote, or another study's, is refused in one sentence (for a report without the mark, whose
    heading alone proves nothing, as not a report sinklab wrote), and so is an option in them
    that is not allowed, named as the records' own."""
    from jinja2.exceptions import UndefinedError  # jinja2: not for the help texts

    from sinklab.studies import render

    docs = Path(docs)
    path = docs.with_suffix(".json")
    foreign = (f"{docs} is not a report sinklab copied into docs (a study's heading or mark, "
               "with its records beside it as .json); give such a report, e.g. docs/zoo.md.")
    name, marked = _report_of(docs) if docs.is_file() else (None, False)
    if name is None or name not in STUDIES or not (marked or path.is_file()):
        raise ResultsError(foreign)
    # the records are sinklab's own output: deleting them would leave nothing to render
    remedy = (f"restore it (e.g. from git: `git checkout -- {path}`) or run the `sinklab {name}` "
              f"command that wrote it again (the report's history names it)")
    if not path.is_file():
        raise ResultsError(f"{docs} is sinklab {name}'s report, but its records file {path} "
                           f"{'is a folder' if path.is_dir() else 'does not exist'}; {remedy}.")
    try:
        result = read_json(path, remedy)
    except ResultsError:
        if marked:
            raise
        result = None  # not JSON beside a heading alone: a file of one's own
    problem = result_problem(result)
    recorded = result["meta"]["study"] if problem is None else None
    if not marked and recorded != name:  # a heading alone, beside a file of one's own
        raise ResultsError(f"{docs} is not a report sinklab wrote: it has no sinklab mark, and "
                           f"{path} beside it is not records of `sinklab {name}`, whose "
                           "heading its first line has; give a report sinklab wrote, e.g. "
                           "docs/zoo.md.")
    if problem is not None:
        raise ResultsError(f"{path} is not records sinklab wrote: {problem}; {remedy}.")
    if recorded != name:
        raise ResultsError(f"{path} holds the records of `sinklab {recorded}`, not of `sinklab "
                           f"{name}`, whose report {docs} is; {remedy}.")
    study = STUDIES[name]
    try:
        opts = options_from(study, result["options"], f"{path}: options")
    except ConfigError as exc:
        raise ResultsError(f"{str(exc).rstrip('.')}; {remedy}.") from None
    try:
        result = {**result, "records": study.completed(result["records"], opts)}
        claims = study.decide(result["records"], opts)
        decided = json.loads(json.dumps(jsonable([c.to_dict() for c in claims])))
        same = decided == result["claims"]
        # whether the records were made by a run before the claims' code decided them this way
        redecided = bool(result.get("redecided")) or not same
        result = {**result, "claims": decided, "reference": reference.records(),
                  "redecided": redecided}
        text = render.report(study, result, claims, opts, docs.with_suffix("").name)
    except (KeyError, IndexError, TypeError, AttributeError, UndefinedError) as exc:
        # records of the right study lacking what its report reads: edited by hand, or from a
        # sinklab whose records differ (--debug shows where)
        raise ResultsError(f"{path} does not hold the records sinklab {name}'s report needs "
                           f"({type(exc).__name__}: {exc}); {remedy}.") from exc
    write_json(path, result)
    write_atomic(docs, (text.rstrip("\n") + "\n\n" + docs_mark(name, docs) + "\n").encode())
    return name, same


# ------------------------------------------------------------------------------ outputs


def _csv_value(value: Any) -> Any:
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
    # matplotlib: not for the help texts
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
    import matplotlib  # not for the help texts

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
    from sinklab.sweeps.store import DB  # torch (the metrics' table): not for the help texts

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
    # torch, jinja2 and matplotlib load when a study runs, not for the help texts
    from sinklab.studies import render
    from sinklab.train import resolve_device, versions

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
        "versions": {**versions(), "matplotlib": _matplotlib_version()},
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
                     _without_bulk(result, study.bulk), study.name)
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
    return read_json(folder / RECORDS, f"run `sinklab {study}` with --out {folder} again, which "
                                       "writes it anew from the finished runs inside")
