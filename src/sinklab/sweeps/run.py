"""Running a sweep: pending cells batched into ensembles, computed by an executor, recorded by
the driver.

Executors only compute: ``compute(job)`` trains one ensemble in a temporary folder and returns
every cell's summary and files, so it can run in a local process or on a Ray worker on another
machine. The driver (this process) alone writes the sweep folder: run folders and the store,
cell by cell as jobs finish. Killing the driver at any moment loses only the jobs in flight;
rerunning the same command resumes.

- ``local`` (default): one process per core (``--workers``), as ``sinklab reproduce`` does.
- ``ray`` (extra ``sinklab[ray]``): each job is a Ray task with one CPU, on the cluster at
  ``--ray-address`` or on a local Ray instance started for the sweep.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from sinklab.config import ConfigError, RunConfig, build_run_config
from sinklab.sweeps import spec as spec_mod
from sinklab.sweeps.store import METRICS, Store
from sinklab.train import _shared, resolve_device, train_runs, versions

EXECUTORS = ("local", "ray")
MAX_MEMBERS = 32  # cells per ensemble at most

Job = list[tuple[str, dict[str, Any]]]  # (cell name, config dict) of one ensemble


@dataclass
class SweepOptions:
    """How ``sinklab sweep`` runs; every value is checked on creation."""

    executor: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    retry_failed: bool = False

    def __post_init__(self) -> None:
        check_executor(self.executor, self.ray_address)
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"--workers={self.workers!r} is not allowed: it must be an integer "
                              ">= 1.")


def check_executor(executor: str, ray_address: str | None) -> None:
    """Raise ConfigError unless ``executor`` is known (and, for Ray, the extra is installed)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor!r} is not allowed: choose one of "
                          f"{', '.join(EXECUTORS)}.")
    if ray_address and executor != "ray":
        raise ConfigError("--ray-address needs --executor ray.")
    if executor == "ray":
        ray_module()


def runner(executor: str, jobs: list[Job], workers: int,
           ray_address: str | None) -> Iterator[tuple[Job, list[dict[str, Any]]]]:
    """The jobs' results as they finish, from the chosen executor."""
    if executor == "ray":
        return run_ray(jobs, workers, ray_address)
    return run_local(jobs, workers)


# ------------------------------------------------------------------------------ compute


def compute(job: Job) -> list[dict[str, Any]]:
    """Train one ensemble (cells that differ only in seed and learning rate) in a temporary
    folder; return each cell's summary and files, or the error that stopped the job."""
    tmp = Path(tempfile.mkdtemp(prefix="sinklab-sweep-"))
    try:
        cfgs = [build_run_config(config) for _, config in job]
        dirs = [tmp / f"cell{i}" for i in range(len(job))]
        try:
            train_runs(cfgs, dirs, progress=False)
        except Exception as exc:  # a job's failure is recorded, the sweep goes on
            return [{"name": name, "error": f"{type(exc).__name__}: {exc}"} for name, _ in job]
        results = []
        for (name, _), folder in zip(job, dirs):
            summary_path = folder / "summary.json"
            if not summary_path.is_file():
                results.append({"name": name, "error": "the run wrote no summary"})
                continue
            files = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
            results.append({"name": name, "summary": json.loads(summary_path.read_text()),
                            "files": files})
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The store's summary numbers of a run (non-finite numbers as None)."""
    bos = summary.get("bos_mass_nontrigger") or [[float("nan")]]
    values = {key: summary.get(key) for key in METRICS if key != "bos_max"}
    values["bos_max"] = max(max(layer) for layer in bos)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in values.items()}


def plan_jobs(rows: list[dict[str, Any]], workers: int) -> list[Job]:
    """Pending cells as ensembles: cells whose configs differ only in seed and learning rate
    train together (at most ``MAX_MEMBERS``); groups are split until every worker has a job."""
    groups: dict[str, Job] = {}
    for row in rows:
        key = json.dumps(_shared(build_run_config(row["config"])), sort_keys=True)
        groups.setdefault(key, []).append((row["name"], row["config"]))
    jobs = [g[i:i + MAX_MEMBERS] for g in groups.values() for i in range(0, len(g), MAX_MEMBERS)]
    while len(jobs) < workers and max((len(j) for j in jobs), default=1) > 1:
        jobs.sort(key=len)
        largest = jobs.pop()
        half = len(largest) // 2
        jobs += [largest[:half], largest[half:]]
    return jobs


def ensemble_cost(cfg: RunConfig, members: int) -> float:
    """A job's work at most, in attention weights times steps (a standard block's MLP counted
    as much again): jobs start longest first, so the last ones to finish are short."""
    return (cfg.model.n_layers * cfg.model.n_heads * cfg.task.seq_len ** 2 * cfg.train.max_steps
            * (2 if cfg.model.block == "standard" else 1) * members)


def _job_cost(job: Job) -> float:
    return ensemble_cost(build_run_config(job[0][1]), len(job))


# ---------------------------------------------------------------------------- executors


def code_version() -> str:
    """sinklab's version, and the git commit of the checkout it runs from (``+dirty`` with
    uncommitted changes), so a stored result names the code that computed it."""
    import subprocess

    version = versions()["sinklab"]
    here = Path(__file__).resolve().parents[1]  # the sinklab package
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return version  # an installed package, no git
    return f"{version}+{commit.stdout.strip()}" + ("-dirty" if dirty.stdout.strip() else "")


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def run_local(jobs: list[Job], workers: int) -> Iterator[tuple[Job, list[dict[str, Any]]]]:
    """Each job's results as it finishes: in this process (one worker) or in a process pool."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield job, compute(job)
        return
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                             initializer=_worker_init) as pool:
        futures = {pool.submit(compute, job): job for job in jobs}
        for future in as_completed(futures):
            yield futures[future], future.result()


def ray_module() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError("--executor ray needs the optional extra sinklab[ray]: "
                          "pip install 'sinklab[ray]'.") from None


def run_ray(jobs: list[Job], workers: int,
            address: str | None) -> Iterator[tuple[Job, list[dict[str, Any]]]]:
    """Each job as a Ray task (one CPU) on the cluster at ``address``, or on a local Ray
    instance with ``workers`` CPUs started here and stopped afterwards."""
    ray = ray_module()
    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
        try:
            ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
        except Exception as exc:  # a wrong address, an unreachable cluster
            raise ConfigError(f"--executor ray could not connect to Ray"
                              f"{' at ' + address if address else ''}: {exc}.") from None
    try:
        task = ray.remote(num_cpus=1)(compute)
        pending = {task.remote(job): job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except Exception as exc:  # a worker that died or raised
                    results = [{"name": name, "error": f"Ray task failed: {exc}"}
                               for name, _ in job]
                yield job, results
    finally:
        if started:
            ray.shutdown()


# ------------------------------------------------------------------------------- driver


def execute(store: Store, jobs: list[Job], executor: str, workers: int,
            ray_address: str | None, version: str
            ) -> Iterator[tuple[Job, list[dict[str, Any]], tuple[int, int]]]:
    """Run ``jobs`` and record each one's results in ``store`` as it finishes; yields the job,
    its results and (cells done, cells failed). ``results.csv`` is rewritten at the end."""
    for job in jobs:
        store.mark_running([name for name, _ in job])
    for job, results in runner(executor, jobs, workers, ray_address):
        yield job, results, record(store, results, version)
    store.export_csv()


def record(store: Store, results: list[dict[str, Any]], version: str) -> tuple[int, int]:
    """Write one job's results into the store (run folders, then rows); return how many
    cells ended done and failed. A diverged run keeps its folder and is marked failed."""
    done = failed = 0
    for r in results:
        if "error" in r:
            store.finish(r["name"], files=None, metrics={}, failed=r["error"], seconds=0.0,
                         version=version)
            failed += 1
            continue
        summary = r["summary"]
        reason = None
        if summary["status"] == "diverged":
            reason = f"diverged at step {summary['steps']}: the loss is not finite"
        store.finish(r["name"], files=r["files"], metrics=metrics_of(summary), failed=reason,
                     seconds=summary.get("wall_time_s", 0.0), version=version)
        failed += reason is not None
        done += reason is None
    return done, failed


class Progress:
    """A live line on a terminal (done / failed / total, ETA); plain log lines otherwise."""

    def __init__(self, total: int, done: int, failed: int, log: Callable[[str], None]) -> None:
        self.total, self.done, self.failed, self.log = total, done, failed, log
        self.start_done = done + failed
        self.start = time.perf_counter()
        self.bar = tqdm(total=total, initial=done + failed, unit="cell", desc="sweep",
                        disable=not sys.stderr.isatty(), leave=False)

    def update(self, done: int, failed: int) -> None:
        self.bar.update(done + failed)
        self.done += done
        self.failed += failed
        self.bar.set_postfix(done=self.done, failed=self.failed)
        if self.bar.disable:
            finished = self.done + self.failed
            rate = (finished - self.start_done) / max(time.perf_counter() - self.start, 1e-9)
            eta = (self.total - finished) / rate if rate > 0 else float("nan")
            self.log(f"sweep: {self.done} done, {self.failed} failed, {self.total} cells; "
                     f"ETA {eta:.0f} s")

    def close(self) -> None:
        self.bar.close()


def run_sweep(spec_path: str | Path, out: str | Path, opts: SweepOptions, *,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the sweep of ``spec_path`` in ``out``; return the store's counts."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    spec = spec_mod.load_spec(spec_path)
    cells = spec_mod.cells(spec)
    for device in {c.config.train.device for c in cells}:
        resolve_device(device)
    version = code_version()
    store = Store.create_or_open(out, spec, cells, version)
    try:
        reset = store.recover(opts.retry_failed)
        counts = store.counts()
        pending = store.rows("pending")
        workers = opts.workers or max(1, min(os.cpu_count() or 1, len(pending)))
        jobs = sorted(plan_jobs(pending, workers), key=_job_cost, reverse=True)
        log(f"sweep: {len(cells)} cells in {out}: {counts['done']} done, {counts['failed']} "
            f"failed, {len(pending)} to run in {len(jobs)} ensembles on {opts.executor} "
            f"({workers} worker(s))" + (f"; {reset} reset to pending" if reset else ""))
        progress = Progress(len(cells), counts["done"], counts["failed"], log)
        try:
            for _, _, outcome in execute(store, jobs, opts.executor, workers, opts.ray_address,
                                         version):
                progress.update(*outcome)
        finally:
            progress.close()
        counts = store.counts()
        log(f"sweep: {counts['done']} done, {counts['failed']} failed of {len(cells)}; wrote "
            f"{Path(out) / 'results.csv'}"
            + ("; `--retry-failed` reruns the failed cells" if counts["failed"] else ""))
        return counts
    finally:
        store.close()
