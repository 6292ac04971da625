"""Running a sweep: pending cells batched into ensembles, computed by an executor, recorded by
the driver.

Executors only compute: ``compute(job)`` trains one ensemble in a temporary folder and returns
every cell's summary and files, so it can run in a local process or on a Ray worker on another
machine. The driver (this process) alone writes the sweep folder: run folders and the store,
cell by cell as jobs finish. Killing the driver at any moment loses only the jobs in flight;
rerunning the same command resumes.

- ``local`` (default): one process per core (``--workers``), as ``sinklab reproduce`` does.
  Workers end when the driver dies; a job whose worker died (killed, out of memory) is run
  again in a fresh pool, alone, twice at most, then recorded as failed.
- ``ray`` (extra ``sinklab[ray]``): each job is a Ray task with one CPU, on the cluster at
  ``--ray-address`` or on a local Ray instance started for the sweep; Ray runs a task again when
  its worker dies (three times at most). A local instance's object store is a share of
  ``SINKLAB_MAX_MEMORY``; Ray gets ``SINKLAB_RAY_START_S`` seconds to start or connect, and a
  cluster with no alive CPU left ends the wait for results (``ray_session``, ``_ray_results``).

Every job carries the driver's plugins (``sinklab.plugins.loaded()``): a worker loads them
before it builds a config, so a rule of one's own trains on spawned processes and Ray workers
alike; the store records them (meta ``plugins``), and resuming without them is refused in one
sentence that names them.

The sweep folder is locked while a driver writes it (``sinklab.runs.folders``), and every ensemble
is
checked against the memory limit (``sinklab.runs.limits``) before anything runs.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from sinklab import kinds
from sinklab import plugins as plugins_mod
from sinklab.errors import ConfigError, PluginError, SinklabError
from sinklab.plugins import Plugin
from sinklab.runs import folders, limits
from sinklab.sweeps import spec as spec_mod
from sinklab.sweeps.plan import Work, sizes, sweep_jobs
from sinklab.sweeps.store import DB, Store, diverged_reason, metrics_of
from sinklab.train import resolve_device, versions

EXECUTORS = ("local", "ray")
POOL_RETRIES = 2  # times a job whose worker process died is run again (local executor)
RAY_RETRIES = 3  # the same, for a Ray task (Ray's own retries)



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


def runner(executor: str, jobs: list[Work], workers: int, ray_address: str | None,
           plugins: Sequence[Plugin] = (), started: Callable[[Work], None] | None = None
           ) -> Iterator[tuple[Work, list[dict[str, Any]]]]:
    """The jobs' results as they finish, from the chosen executor; every worker loads
    ``plugins`` first. The local executor calls ``started(job)`` as a worker takes a job."""
    if executor == "ray":
        return run_ray(jobs, workers, ray_address, plugins)
    return run_local(jobs, workers, plugins, started)


# ------------------------------------------------------------------------------ compute


def compute(job: Work, plugins: Sequence[Plugin] = ()) -> list[dict[str, Any]]:
    """Train one ensemble (cells that differ only in seed and learning rate), or one language
    model (``sinklab.kinds``), in a temporary folder (a study's language models in its
    ``.partial`` folder, ``kinds.resume_dirs``, so that they resume), after loading the
    driver's ``plugins`` (``sinklab.plugins``); return each cell's summary and files, or the
    error that stopped the job."""
    try:
        plugins_mod.load_on_worker(plugins)
    except PluginError as exc:  # every cell of the job fails with the reason
        return _lost(job, str(exc))
    tmp = Path(tempfile.mkdtemp(prefix="sinklab-sweep-"))
    _SCRATCH.add(tmp)
    try:
        cfgs = [kinds.from_dict(config) for _, config in job]
        dirs = kinds.resume_dirs(cfgs, [name for name, _ in job]) or \
            [tmp / f"cell{i}" for i in range(len(job))]
        try:
            kinds.train(cfgs, dirs)
        except Exception as exc:  # a job's failure is recorded, the sweep goes on
            return [{"name": name, "error": f"{type(exc).__name__}: {exc}"} for name, _ in job]
        results = []
        for (name, _), folder in zip(job, dirs):
            summary_path = folder / "summary.json"
            if not summary_path.is_file():
                results.append({"name": name, "error": "the run wrote no summary"})
                continue
            files = {f.relative_to(folder).as_posix(): f.read_bytes()
                     for f in sorted(folder.rglob("*")) if f.is_file()}
            results.append({"name": name, "summary": json.loads(summary_path.read_text()),
                            "files": files})
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _SCRATCH.discard(tmp)


_SCRATCH: set[Path] = set()  # the temporary folders of the jobs this process is computing


# ---------------------------------------------------------------------------- executors


def code_version() -> str:
    """sinklab's version, and the git commit of the checkout it runs from (``+dirty`` with
    uncommitted changes), so a stored result names the code that computed it."""
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


def exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """End this process soon after ``parent``, the process that started it, dies.

    A worker of a local pool waits on its parent for work; if the parent is killed (SIGKILL
    gives it no chance to stop its pool), the worker would wait, or train, forever. A daemon
    thread notices that the parent is gone (the worker is handed to another parent) and exits.
    The parent's id comes from the parent itself: by the time a worker has imported torch its
    parent may already be gone.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        for tmp in list(_SCRATCH):  # the job in hand will never be collected
            shutil.rmtree(tmp, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="sinklab-exit-with-parent", daemon=True).start()


def _worker_init(parent: int) -> None:
    exit_with_parent(parent)
    # tqdm's default lock is a process-shared semaphore, registered with the driver's
    # resource tracker: a worker stopped by an interrupt would leave it behind, and Python
    # warns of "leaked semaphore objects". A worker's bars (none are shown) need a thread lock.
    tqdm.set_lock(threading.RLock())

    torch.set_num_threads(1)


def _lost(job: Work, reason: str) -> list[dict[str, Any]]:
    return [{"name": name, "error": reason} for name, _ in job]


def run_local(jobs: list[Work], workers: int, plugins: Sequence[Plugin] = (),
              started: Callable[[Work], None] | None = None
              ) -> Iterator[tuple[Work, list[dict[str, Any]]]]:
    """Each job's results as it finishes: in this process (one worker) or in a process pool
    of spawned processes, each of which loads ``plugins`` with its first job.

    A job is handed to the pool only when a worker is free for it, and ``started(job)`` is
    called then (a sweep marks its cells running), so the jobs still queued are not running.
    When a worker process dies (killed, out of memory) the pool breaks and every job in it is
    lost; those jobs run again in a fresh pool, up to ``POOL_RETRIES`` times each, then come
    back as failed, and the jobs not yet handed out wait for the fresh pool. A job lost once
    runs again alone (no other job in flight beside it), so that a job whose worker keeps
    dying does not cost the jobs that happened to share its pool their tries."""
    start = started or (lambda job: None)
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            start(job)
            yield job, compute(job, plugins)
        return
    ctx = get_context("spawn")
    tries = {id(job): 0 for job in jobs}
    queue = list(jobs)

    def free(futures: dict[Any, Work]) -> bool:
        """Whether the next job may start now: a worker is free, no job lost before is in
        flight, and the next one, if it was lost before, would be in flight alone."""
        if len(futures) >= workers or any(tries[id(job)] for job in futures.values()):
            return False
        return not (tries[id(queue[0])] and futures)

    while queue:
        pool = ProcessPoolExecutor(max_workers=min(workers, len(queue)), mp_context=ctx,
                                   initializer=_worker_init, initargs=(os.getpid(),))
        lost: list[Work] = []
        finished = False
        try:
            futures: dict[Any, Work] = {}
            broken = False
            while queue or futures:
                while queue and not broken and free(futures):  # a free worker each
                    try:
                        future = pool.submit(compute, queue[0], plugins)
                    except BrokenProcessPool:  # a worker died: the job waits for a fresh pool
                        broken = True
                        break
                    job = queue.pop(0)
                    start(job)
                    futures[future] = job
                if not futures:
                    break  # the pool broke: the jobs left wait for a fresh one
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    job = futures.pop(future)
                    try:
                        results = future.result()
                    except BrokenProcessPool:
                        lost.append(job)
                        broken = True
                        continue
                    yield job, results
            finished = True
        finally:
            if not finished:  # interrupted or failed: the jobs in flight are lost anyway
                for process in list(getattr(pool, "_processes", {}).values()):
                    process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
        again = []
        for job in lost:
            tries[id(job)] += 1
            if tries[id(job)] > POOL_RETRIES:
                yield job, _lost(job, f"its worker process died {tries[id(job)]} times "
                                      "(killed, or out of memory)")
            else:
                again.append(job)
        queue = again + queue


def ray_module() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError("--executor ray needs the optional extra sinklab[ray]: "
                          "pip install 'sinklab[ray]'.") from None


RAY_START_ENV = "SINKLAB_RAY_START_S"  # the seconds ray.init may take to start or connect
RAY_START_S = 120.0  # its default: a local start takes 3-5 s here, a first connection longer
RAY_POLL_S = 30.0  # ray.wait's timeout between checks that the cluster still has a CPU alive


class RayLost(SinklabError):
    """Ray has no alive node with a CPU left to run the jobs still waiting, or stopped
    answering; one sentence."""


def ray_start_limit() -> float:
    """The seconds ``ray.init`` may take: ``SINKLAB_RAY_START_S``, default ``RAY_START_S``."""
    text = os.environ.get(RAY_START_ENV, "").strip()
    if not text:
        return RAY_START_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{RAY_START_ENV}={text!r} is not allowed: give the seconds Ray may "
                          f"take to start or connect, a number > 0 (default {RAY_START_S:g}).")
    return value


def run_ray(jobs: list[Work], workers: int, address: str | None,
            plugins: Sequence[Plugin] = ()) -> Iterator[tuple[Work, list[dict[str, Any]]]]:
    """Each job as a Ray task (one CPU) on the cluster at ``address``, or on a local Ray
    instance with ``workers`` CPUs started here and stopped afterwards (``ray_session``); each
    task loads ``plugins`` first (a file plugin travels as its text, a module must be
    importable on the worker). Connects at once (a refused connection is a ConfigError before
    any job is marked running); the results come from the returned iterator."""
    session = ExitStack()
    session.enter_context(ray_session(address, workers))
    return _ray_results(session, jobs, plugins)


@contextmanager
def ray_session(address: str | None, workers: int) -> Iterator[None]:
    """Ray connected (or a local instance with ``workers`` CPUs started) for the body, and shut
    down after it, unless the caller had already initialised Ray.

    A local instance's object store is ``limits.ray_object_store_bytes()`` (a quarter of
    ``SINKLAB_MAX_MEMORY``, at most 2 GiB, at least Ray's minimum of 75 MiB), given to
    ``ray.init`` so that Ray does not size it from the machine (30 % of its free memory, which
    under an address-space cap leaves its workers no room); a cluster's store is its own.
    ``ray.init`` may take ``SINKLAB_RAY_START_S`` seconds (``ray_start_limit``) to start or
    connect; past that, Ray is shut down and the session ends in one sentence (ConfigError),
    as a refused connection does, before the caller writes anything."""
    ray = ray_module()
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS") or None  # Ray reads it too
    seconds = ray_start_limit()
    if address:
        check_reachable(address)
    kwargs: dict[str, Any] = {"address": address} if address else {
        "num_cpus": workers, "object_store_memory": limits.ray_object_store_bytes()}
    keeper = _RayKeeper(ray, include_dashboard=False, log_to_driver=False,
                        logging_level=logging.ERROR, **kwargs)
    try:
        up = keeper.start(seconds)
    except BaseException as exc:  # ray.init's own error, or an interrupt while waiting
        keeper.abandon()
        if isinstance(exc, Exception):  # a wrong address, an unreachable cluster, a token
            raise ConfigError(ray_refusal(exc, address)) from None
        raise
    if not up:
        keeper.abandon()
        raise ConfigError(ray_timeout(seconds, address, kwargs.get("object_store_memory")))
    try:
        yield
    finally:
        keeper.stop()


class _RayKeeper:
    """``ray.init`` in a thread of its own that lives until ``stop``, so that starting can be
    given a time limit (Ray has none for a local instance that never comes up, and waits for it
    in silence). The thread must outlive the start: Ray's processes are killed when the thread
    that started them ends (Linux's parent-death signal, which Ray sets, follows the thread)."""

    def __init__(self, ray: Any, **kwargs: Any) -> None:
        self.ray, self.kwargs = ray, kwargs
        self.started, self.released = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.abandoned = False
        self.thread = threading.Thread(target=self._run, name="sinklab-ray", daemon=True)

    def _run(self) -> None:
        try:
            self.ray.init(**self.kwargs)
        except BaseException as exc:  # handed to the waiting thread
            self.error = exc
            self.started.set()
            return
        self.started.set()
        self.released.wait()
        if self.abandoned:  # it came up after the caller gave up on it
            self.ray.shutdown()

    def start(self, seconds: float) -> bool:
        """Start Ray and wait ``seconds`` for it: True when it is up, False when it is not yet;
        ``ray.init``'s own error is raised."""
        self.thread.start()
        if not self.started.wait(seconds):
            return False
        if self.error is not None:
            raise self.error
        return True

    def abandon(self) -> None:
        """Give up on it: shut down whatever Ray has started, and let a start that completes
        later shut itself down."""
        self.abandoned = True
        self.released.set()
        self.ray.shutdown()

    def stop(self) -> None:
        """The end of the session: Ray shut down, then the thread let go."""
        try:
            self.ray.shutdown()
        finally:
            self.released.set()
            self.thread.join(5)


def ray_timeout(seconds: float, address: str | None, store: int | None) -> str:
    """One sentence for Ray not starting or connecting within ``seconds``."""
    if address:
        return (f"Ray did not connect to the cluster at {address} within {seconds:g} s "
                f"({RAY_START_ENV}); check that it is up (`ray status --address {address}`), or "
                f"allow it longer with {RAY_START_ENV}=SECONDS.")
    return (f"Ray did not start within {seconds:g} s ({RAY_START_ENV}); a local instance that "
            "never comes up is usually short of memory (its object store was given "
            f"{limits.format_bytes(store or 0)}, a share of {limits.MEMORY_ENV}): see Ray's logs "
            f"under /tmp/ray/session_latest/logs, or allow it longer with "
            f"{RAY_START_ENV}=SECONDS.")


def ray_cpus_alive(ray: Any) -> float:
    """The CPUs of the cluster's alive nodes, as Ray reports them (0: none left)."""
    return sum(node.get("Resources", {}).get("CPU", 0.0) for node in ray.nodes()
               if node.get("Alive"))


def _check_alive(ray: Any, waiting: int) -> None:
    """RayLost, in one sentence, when the cluster has no alive node with a CPU left to run the
    ``waiting`` jobs, or does not answer; otherwise nothing (a job may run for hours)."""
    try:
        cpus = ray_cpus_alive(ray)
    except Exception as exc:  # the cluster's control store is gone
        raise RayLost(f"Ray stopped answering while {waiting} job(s) were waiting "
                      f"({' '.join(str(exc).split())[:200] or type(exc).__name__}); the cells "
                      "that finished are kept: run the same command again to run the others.") \
            from None
    if cpus <= 0:
        raise RayLost(f"Ray has no alive node with a CPU left while {waiting} job(s) were "
                      "waiting (its nodes died or left the cluster); the cells that finished "
                      "are kept: run the same command again to run the others.")


def _ray_results(session: ExitStack, jobs: list[Work], plugins: Sequence[Plugin]
                 ) -> Iterator[tuple[Work, list[dict[str, Any]]]]:
    ray = ray_module()
    with session:  # ends the Ray session run_ray started, if it started one
        # A task whose worker process dies is run again by Ray; an error raised inside
        # compute is not (compute returns it as the job's failure).
        task = ray.remote(num_cpus=1, max_retries=RAY_RETRIES, retry_exceptions=False)(compute)
        shipped = ray.put(list(plugins))  # once, not with every task
        pending = {task.remote(job, shipped): job for job in jobs}
        while pending:
            # bounded, so that a cluster whose every node died cannot keep us waiting in
            # silence; a job that merely runs long is waited for as long as it takes
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=RAY_POLL_S)
            if not ready:
                _check_alive(ray, len(pending))
            for ref in ready:
                job = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except Exception as exc:  # a worker that died too often, or a lost node
                    results = _lost(job, f"Ray task failed: {' '.join(str(exc).split())[:300]}")
                yield job, results


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` address where nothing answers: Ray itself would retry for many
    minutes before it gave up. ``auto`` and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"--ray-address {address}: nothing answers there "
                          f"({exc.strerror or type(exc).__name__}); start the cluster first "
                          "(`ray start --head`, docs/sweeps.md) or check the address.") from None


def _messages(exc: BaseException | None) -> str:
    """The text of an exception and of every exception behind it (Ray's ConnectionError says
    nothing of a refused token; its cause does)."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " ".join(" ".join(texts).split())


def ray_refusal(exc: BaseException, address: str | None) -> str:
    """One sentence for Ray refusing or failing to start or connect."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    where = f" at {address}" if address else ""
    chain = _messages(exc).lower()
    if "authenticationerror" in chain or "invalidauthtoken" in chain \
            or "authentication token" in chain:
        return (f"Ray refused the connection{where}: the cluster uses token authentication and "
                "this process did not present its token; set RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) here as on every node of the cluster, "
                "or RAY_AUTH_MODE=disabled everywhere on a trusted network (docs/sweeps.md).")
    return f"--executor ray could not start or connect to Ray{where}: {text[:300].rstrip('.')}."


# ------------------------------------------------------------------------------- driver


def execute(store: Store, jobs: list[Work], executor: str, workers: int,
            ray_address: str | None, version: str
            ) -> Iterator[tuple[Work, list[dict[str, Any]], tuple[int, int]]]:
    """Run ``jobs`` and record each one's results in ``store`` as it finishes; yields the job,
    its results and (cells done, cells failed). ``results.csv`` is rewritten at the end. The
    workers load this process's plugins; the store records those whose rules the jobs use."""
    if not jobs:
        store.export_csv()
        return
    plugins = plugins_mod.loaded()
    store.record_plugins(plugins_mod.sources(config["model"]["attention"]
                                             for job in jobs for _, config in job))
    def running(job: Work) -> None:
        store.mark_running([name for name, _ in job])

    # A cell is running only while a worker computes it: the local executor says when it hands
    # a job to a worker; Ray queues every task on the cluster at once.
    results_of = runner(executor, jobs, workers, ray_address, plugins,  # Ray connects here
                        started=None if executor == "ray" else running)
    if executor == "ray":
        for job in jobs:
            running(job)
    for job, results in results_of:
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
        reason = diverged_reason(summary)
        try:
            values = metrics_of(summary)
        except Exception as exc:  # one cell's odd summary must not cost its ensemble-mates
            values, reason = {}, f"its summary could not be read ({type(exc).__name__}: {exc})"
        store.finish(r["name"], files=r["files"], metrics=values, failed=reason,
                     seconds=summary.get("wall_time_s") or 0.0, version=version)
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


def _recorded_plugins(out: Path) -> list[str]:
    """The plugins a sweep folder's store records (none for a folder without one)."""
    if not (out / DB).is_file():
        return []
    try:
        store = Store.read(out)
    except Exception:  # a damaged store is reported where the sweep opens it
        return []
    try:
        return store.plugins()
    finally:
        store.close()


def _adopt_legacy(out: Path) -> None:
    """Mark a sweep folder written before folders had markers (it has a sinklab sweep
    database of its own, and nothing says otherwise)."""
    if (out / DB).is_file() and not (out / folders.MARKER).exists():
        store = Store.read(out)
        try:
            if store.meta().get("origin") == "sweep":
                folders.mark(out, "sweep")
        finally:
            store.close()


def run_sweep(spec_path: str | Path, out: str | Path, opts: SweepOptions, *,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the sweep of ``spec_path`` in ``out``; return the store's counts.

    Everything is checked before the folder is touched: the spec, the devices, and that every
    cell fits in memory. The folder is then claimed and locked for as long as this runs.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        spec = spec_mod.load_spec(spec_path)
    except spec_mod.UnknownRule as exc:  # name the plugins the sweep ran with, if it did
        recorded = _recorded_plugins(Path(out))
        if not recorded:
            raise
        raise spec_mod.UnknownRule(f"{str(exc).rstrip('.')}; {out} ran with --plugin "
                                   f"{' --plugin '.join(recorded)}.") from None
    cells = spec_mod.cells(spec)
    for device in {c.config.train.device for c in cells}:
        resolve_device(device)
    rows = [{"name": c.name, "config": c.config.to_dict()} for c in cells]
    every = sweep_jobs(rows, opts.workers or 1)  # every cell fits in memory
    if opts.executor == "local" and opts.workers:  # and so do the workers asked for
        limits.workers_that_fit(sizes(every), opts.workers, explicit=True)
    out = Path(out)
    _adopt_legacy(out)
    folders.check_writable(out, "sweep")
    version = code_version()
    # Ray connects before the folder is touched: a refused connection writes nothing.
    session = (ray_session(opts.ray_address, opts.workers or os.cpu_count() or 1)
               if opts.executor == "ray" else nullcontext())
    with session, folders.writing(out, "sweep"):
        store = Store.create_or_open(out, spec, cells, version)
        try:
            return _drive(store, spec, cells, out, opts, version, log)
        finally:
            store.close()


def _drive(store: Store, spec: spec_mod.Spec, cells: list[spec_mod.Cell], out: Path,
           opts: SweepOptions, version: str, log: Callable[[str], None]) -> dict[str, Any]:
    reset = store.recover(opts.retry_failed)
    for name, problem in store.verify_done():
        log(f"sweep: {name}: {problem}; it runs again")
    counts = store.counts()
    pending = store.rows("pending")
    workers = opts.workers or max(1, min(os.cpu_count() or 1, len(pending)))
    jobs = sorted(sweep_jobs(pending, workers), key=lambda job: job.cost, reverse=True)
    if opts.executor == "local":
        workers = limits.workers_that_fit(sizes(jobs), workers, explicit=opts.workers is not None)
    log(f"sweep: {len(cells)} cells in {out}: {counts['done']} done, {counts['failed']} "
        f"failed, {len(pending)} to run in {len(jobs)} ensembles on {opts.executor} "
        f"({workers} worker(s))" + (f"; {reset} reset to pending" if reset else ""))
    progress = Progress(len(cells), counts["done"], counts["failed"], log)
    try:
        for _, _, outcome in execute(store, [job.work() for job in jobs], opts.executor,
                                     workers, opts.ray_address, version):
            progress.update(*outcome)
    finally:
        progress.close()
    counts = store.counts()
    log(f"sweep: {counts['done']} done, {counts['failed']} failed of {len(cells)}; wrote "
        f"{out / 'results.csv'}"
        + ("; `--retry-failed` reruns the failed cells" if counts["failed"] else ""))
    return counts
