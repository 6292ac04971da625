"""A study's declaration: what every experiment command is, written once.

A study *declares* what it is (``Study``): its options (a dataclass, one typed section of the
config system, ``sinklab.studies.options``), the training runs it needs (``cells``), its report
(a Jinja2 template) and the name of its *analysis module*, which holds how finished runs become
records (``collect``), its claims (``sinklab.claims``) and its figures (functions of matplotlib
axes). The declaration needs no torch, so that ``sinklab --help`` and every command's help stay
light; the analysis module imports torch and the science at its top and is imported once, when
the study runs or renders (``Study.analysed``). ``sinklab.studies.runner`` runs a study
the same way for every study.

Declaring a ``Study`` and passing it to ``register`` gives it a ``sinklab NAME`` subcommand
(``sinklab.cli``) whose options are generated from the dataclass: ``--seeds 10``, ``--config
FILE`` with a ``[NAME]`` table (one file may hold several studies' tables, e.g.
``docs/studies.toml``), or ``NAME.seeds=10``, later ones winning.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sinklab import claims as claims_mod
from sinklab import heavy, kinds
from sinklab.claims import Claim
from sinklab.config import check_count
from sinklab.errors import ConfigError, ResultsError
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_json

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
        sweeps = heavy("sweeps.run")
        train = heavy("train")

        if self.workers is not None:
            check_count("--workers", self.workers)
        train.resolve_device(self.device, "--device")
        sweeps.check_executor(self.executor, self.ray_address)

    def session(self) -> Any:
        """Ray connected for the study's whole run (before its folder is touched, so that a
        refused connection writes nothing), or nothing to do for the local executor."""
        if self.executor != "ray":
            return nullcontext()
        sweeps = heavy("sweeps.run")

        return sweeps.ray_session(self.ray_address, self.workers or os.cpu_count() or 1)


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


_ANALYSES: dict[str, ModuleType] = {}  # analysis modules by name, each imported once


@dataclass(frozen=True)
class Study:
    """A study's declaration; ``sinklab.studies.runner.run_study`` runs it.

    - ``name``: the subcommand, the folder's kind and the options' config table;
    - ``title``: the report's first line (``# title``);
    - ``options``: a dataclass whose fields are the study's options, each with
      ``metadata={"help": ...}`` (and optionally ``"flag"``, ``"metavar"``); it validates itself
      in ``__post_init__`` and may define ``quick`` handling there;
    - ``analysis``: the analysis module (its name, imported when the study first needs it, or
      the module or namespace itself), which holds:

      - ``collect(ctx)``: records, a dict of JSON-able values, from the finished runs;
      - ``claims(records, opts)`` (optional): the report's verdicts, each a ``Claim``;
      - ``FIGURES`` (optional): ``FigureSpec``s, drawn into ``figures/NAME.png``;
      - ``complete(records, opts)`` (optional): records a claim's control needs that are cheap
        to compute from the options alone (an untrained model's measurements), added to records
        that lack them, by a run and by ``sinklab render``, and returned as the records
        completed;
      - ``more_cells(ctx)`` (optional): runs that depend on finished ones (a learning-rate
        search's next rate, fresh seeds at the rate it found), asked for after each round of
        training until it names none that is not planned yet (rounds; a resumed study replays
        them from its finished runs), under the top folders of ``cells`` or those declared in
        ``more_folders``;
      - ``check(opts, exe, out)`` (optional): checks needing more than the options (a model that
        must exist), before anything is written;
    - ``cells(opts, exe)``: the runs to train (pure: names and configs, nothing is read);
    - ``template``: a Jinja2 template name (``sinklab/studies/templates``) rendering the report;
    - ``tables``: names of record lists written as ``NAME.csv``;
    - ``bulk``: record entries that only the figures need (attention maps), left out of the
      records copied beside ``--docs FILE``;
    - ``reuse(opts)``: other sinklab folders whose finished runs of the same names and settings
      are adopted before planning (``runner.adopt_runs``), so that they are not trained again.
    """

    name: str
    title: str
    help: str
    description: str
    options: type
    template: str
    analysis: str | Any
    cells: Callable[[Any, Execution], list[Cell]] = _no_cells
    tables: tuple[str, ...] = ()
    bulk: tuple[str, ...] = ()  # record entries only figures need: not in the docs copy
    report: str = "REPORT.md"
    trains: bool = True  # offers --workers / --executor (studies that train runs)
    reuse: Callable[[Any], Sequence[Path]] | None = None  # folders to adopt finished runs from
    docs_example: str = ""
    default_out: str = ""
    # the keys of the study's primary claims, named before it runs: corrected together by Holm
    primary: tuple[str, ...] = ()
    more_folders: tuple[str, ...] = ()  # the first folder of every cell more_cells names

    @property
    def heading(self) -> str:
        return f"# {self.title}"

    @property
    def analysed(self) -> Any:
        """The analysis module: imported the first time it is asked for, once. A name that no
        module has, or a module without ``collect``, is refused in one sentence (a study of
        one's own names its analysis as a plugin does)."""
        if not isinstance(self.analysis, str):
            found = self.analysis
        elif self.analysis in _ANALYSES:
            return _ANALYSES[self.analysis]
        else:
            try:
                found = importlib.import_module(self.analysis)
            except ModuleNotFoundError as exc:
                if exc.name is None or not self.analysis.startswith(exc.name):
                    raise  # a module the analysis itself imports: its own error
                raise ConfigError(f"sinklab {self.name}: its analysis module "
                                  f"{self.analysis!r} cannot be imported ({exc}); give "
                                  "Study(analysis=...) the name of an importable module that "
                                  "defines collect.") from None
        if not callable(getattr(found, "collect", None)):
            raise ConfigError(f"sinklab {self.name}: its analysis {self.analysis!r} defines no "
                              "collect(ctx); the analysis must give the study's records.")
        if isinstance(self.analysis, str):
            _ANALYSES[self.analysis] = found
        return found

    def collect(self, ctx: Context) -> dict[str, Any]:
        return self.analysed.collect(ctx)

    @property
    def claims(self) -> Callable[[Any, Any], list[Claim]]:
        return getattr(self.analysed, "claims", _no_claims)

    @property
    def figures(self) -> tuple[FigureSpec, ...]:
        return tuple(getattr(self.analysed, "FIGURES", ()))

    @property
    def complete(self) -> Callable[[dict[str, Any], Any], dict[str, Any]] | None:
        return getattr(self.analysed, "complete", None)

    @property
    def more_cells(self) -> Callable[[Context], list[Cell]] | None:
        return getattr(self.analysed, "more_cells", None)

    @property
    def check(self) -> Callable[[Any, Execution, Path], None] | None:
        return getattr(self.analysed, "check", None)

    def completed(self, records: dict[str, Any], opts: Any) -> dict[str, Any]:
        """The records with what ``complete`` adds (the records as they are without one)."""
        return records if self.complete is None else self.complete(records, opts)

    def decide(self, records: Any, opts: Any) -> list[Claim]:
        """The report's claims decided together (``claims.finalize``): the primary claims
        corrected by Holm, the other empirical claims by Benjamini-Hochberg. A study that
        decided nothing (``sinklab pretrain`` whose pilot found no protocol to train at) has no
        primary claim to name."""
        decided = self.claims(records, opts)
        return claims_mod.finalize(decided, self.primary if decided else ())

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
