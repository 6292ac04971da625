"""Planning: runs batched into ensembles, the one way every sinklab command groups its runs.

A ``Job`` is runs trained together in one process: their names (relative to the folder they are
written into) and their configs (task runs or language models, ``sinklab.kinds``). ``ensembles``
groups items; a sweep plans its pending cells with it (``sweep_jobs``), a study its unfinished
cells (``plan``). A job too large for the memory limit is split (``fitted``), and jobs start
longest first (``Job.cost``), so that the last ones to finish are short. A worker receives a job
as ``Job.work()``: (name, config dictionary) pairs, which a process pool or a Ray task can carry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sinklab import kinds
from sinklab.config import build_run_config
from sinklab.errors import ResultsError
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.train import ensemble_part

T = TypeVar("T")
MAX_MEMBERS = 32  # a sweep's cells per ensemble at most
Work = list[tuple[str, dict[str, Any]]]  # a job as a worker receives it: (name, config) pairs


@dataclass
class Job:
    """Runs trained together as one ensemble in one process."""

    label: str
    names: list[str]
    configs: list[kinds.Config]

    @property
    def cost(self) -> float:
        """Its work (``sinklab.kinds.cost``), by which jobs are ordered."""
        return kinds.cost(self.configs[0], len(self.configs))

    @property
    def size(self) -> int:
        """The memory it needs (``sinklab.kinds.run_bytes``)."""
        return kinds.run_bytes(self.configs[0], len(self.configs))

    def work(self) -> Work:
        return [(name, cfg.to_dict()) for name, cfg in zip(self.names, self.configs)]


def ensembles(items: Sequence[T], key: Callable[[T], Any], size: Callable[[list[T]], int],
              workers: int = 1) -> list[list[T]]:
    """The items as ensembles: grouped by ``key`` in the order they come, each group cut into
    parts of at most ``size(group)`` items, and the largest part halved until there are
    ``workers`` parts (or none can be halved)."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    parts = []
    for group in groups.values():
        n = size(group)
        parts += [group[i:i + n] for i in range(0, len(group), n)]
    while len(parts) < workers and max((len(p) for p in parts), default=1) > 1:
        parts.sort(key=len)
        largest = parts.pop()
        half = len(largest) // 2
        parts += [largest[:half], largest[half:]]
    return parts


def fitted(jobs: Sequence[Job]) -> list[Job]:
    """Every job split into ensembles small enough for the memory limit (refused when one run
    alone is too large)."""
    out = []
    for job in jobs:
        size = kinds.members_that_fit(job.configs[0], len(job.configs), job.label)
        out += [Job(job.label, job.names[i:i + size], job.configs[i:i + size])
                for i in range(0, len(job.configs), size)]
    return out


def sizes(jobs: Sequence[Job]) -> list[int]:
    """The memory each job needs."""
    return [job.size for job in jobs]


# ------------------------------------------------------------------------------- sweeps


def sweep_jobs(rows: list[dict[str, Any]], workers: int) -> list[Job]:
    """A sweep's pending cells (store rows: name and config) as ensembles: cells whose configs
    differ only in seed and learning rate train together (at most ``MAX_MEMBERS``, fewer when
    that many would not fit in memory); groups are split until every worker has a job. A cell
    too large to train even alone is a ConfigError."""
    def shared(row: dict[str, Any]) -> str:
        return json.dumps(ensemble_part(build_run_config(row["config"])), sort_keys=True)

    def fit(group: list[dict[str, Any]]) -> int:
        return kinds.members_that_fit(build_run_config(group[0]["config"]),
                                      min(len(group), MAX_MEMBERS), f"cell {group[0]['name']}")

    return [Job(part[0]["name"], [row["name"] for row in part],
                [build_run_config(row["config"]) for row in part])
            for part in ensembles(rows, shared, fit, workers)]


# ------------------------------------------------------------------------------ studies


class Planned(Protocol):
    """What a study's cell tells the planner (``sinklab.studies.study.Cell``)."""

    name: str
    config: kinds.Config
    group: tuple[Any, ...]
    label: str
    chunk: int | None


P = TypeVar("P", bound=Planned)


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


def unique_cells(cells: Sequence[P]) -> list[P]:
    """The cells by name, each once; one name with two different configs is a bug."""
    seen: dict[str, P] = {}
    for cell in cells:
        first = seen.setdefault(cell.name, cell)
        if first.config != cell.config:
            raise RuntimeError(f"the study names {cell.name} twice with different settings")
    return list(seen.values())


def plan(out: Path, cells: Sequence[Planned], log: Callable[[str], None]
         ) -> tuple[list[Job], int]:
    """A study's unfinished cells as ensembles, most expensive first, and how many had
    finished.

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
            log(f"{exc.problem}; it is trained again")
            finished = False
        if finished:
            done += 1
        else:
            pending.append(cell)
    return jobs_of(pending), done


def jobs_of(cells: Sequence[Planned]) -> list[Job]:
    """A study's ``cells`` as ensembles (by group, at most ``chunk`` members), most expensive
    first."""
    jobs = []
    for part in ensembles(list(cells), lambda c: c.group, lambda g: g[0].chunk or len(g)):
        seeds = [c.config.train.seed for c in part]
        seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} runs"
        jobs.append(Job(f"{part[0].label or part[0].name} {seed_text}".strip(),
                        [c.name for c in part], [c.config for c in part]))
    jobs.sort(key=lambda j: j.cost, reverse=True)
    return jobs
