"""Sweeps: spec validation with locations, the SQLite store, resuming after SIGKILL, failed
cells, foreign folders, and the same results from the local and the Ray executors."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli
from sinklab.errors import ConfigError
from sinklab.sweeps import spec as spec_mod
from sinklab.sweeps.store import Store

TINY = """description = "tiny"
seeds = 2

[base]
train.max_steps = 30

[grid]
"model.attention" = ["softmax", "relu"]
"task.seq_len" = [8, 12]
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- specs


def test_cells_expand_the_grid_with_deterministic_names(tmp_path):
    spec = spec_mod.load_spec(write(tmp_path, TINY))
    cells = spec_mod.cells(spec)
    assert [c.name for c in cells[:3]] == [
        "model.attention=softmax,task.seq_len=8,seed=0",
        "model.attention=softmax,task.seq_len=8,seed=1",
        "model.attention=softmax,task.seq_len=12,seed=0"]
    assert len(cells) == 8 and len({c.name for c in cells}) == 8
    last = cells[-1]
    assert (last.config.model.attention, last.config.task.seq_len, last.config.train.seed,
            last.config.train.max_steps) == ("relu", 12, 1, 30)
    again = spec_mod.load_spec(write(tmp_path, TINY, "copy.toml"))
    assert again.to_json() == spec.to_json()  # the content, not the path, names the sweep


@pytest.mark.parametrize(("text", "message", "line"), [
    ("colour = 3\n" + TINY, "unknown key 'colour'", 1),
    (TINY.replace('"task.seq_len"', '"task.seqlen"'), "unknown grid key 'task.seqlen'", 9),
    (TINY.replace("[8, 12]", '["eight", 12]'),
     "'eight' is a string, but task.seq_len takes an integer", 9),
    (TINY.replace("[8, 12]", "[]"), "grid key 'task.seq_len' (line 9) must be a non-empty list",
     9),
    (TINY.replace("[8, 12]", "[2, 12]"), "task.seq_len=2 is not allowed", None),
    ("seeds = 2\n[grid]\n", "the grid (line 2) is empty or missing", 2),
    (TINY.replace("seeds = 2", "seeds = 0"), "seeds=0 is not allowed", 2),
    (TINY.replace("train.max_steps = 30", "train.max_step = 30"),
     "unknown key 'base.train.max_step'", 5),
    (TINY.replace("train.max_steps = 30", "train.max_steps = -1"),
     "train.max_steps=-1 is not allowed", 4),
    (TINY + '"train.seed" = [1]\n', "grid key 'train.seed' (line 10) is not allowed", 10),
    ("seeds = [1, 1]\n[grid]\n\"model.attention\" = [\"relu\"]\n",
     "seeds=[1, 1] is not allowed", 1),
    ("[grid\n", "is not valid TOML", None),
    (TINY.replace("train.max_steps = 30", "train.max_steps = 30\ntask.seq_len = 8"),
     "grid key 'task.seq_len' (line 10) is also set in [base] (line 6): a key is either fixed "
     "in [base] or varied in [grid], not both", 10),
    ('[base.model]\nattention = "sigmoid"\n[base.model.attention_args]\nbias = 1.0\n'
     '[grid]\n"model.attention_args.bias" = [0.5, 2.0]\n',
     "grid key 'model.attention_args.bias' (line 6) is also set in [base] (line 4)", 6),
])
def test_bad_specs_name_the_key_and_line(tmp_path, capsys, text, message, line):
    path = write(tmp_path, text)
    with pytest.raises(spec_mod.SpecError) as info:
        spec_mod.load_spec(path)
    assert message in str(info.value)
    if line is not None:
        assert f"(line {line})" in str(info.value)
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------- the store


def test_sweep_runs_records_and_resumes(tmp_path, capsys):
    spec, out = write(tmp_path, TINY), tmp_path / "sw"
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 0, err
    store = Store.read(out)
    rows = store.rows()
    assert [r["status"] for r in rows] == ["done"] * 8
    from sinklab import __version__

    assert all(r["attempts"] == 1 and r["code_version"].startswith(__version__)
               and r["seconds"] > 0 for r in rows)
    assert rows[0]["metrics"]["steps"] == 30 and 0 <= rows[0]["metrics"]["bos_max"] <= 1
    for r in rows:  # each cell's folder, with its own config
        folder = out / "runs" / r["name"]
        config = json.loads((folder / "config.json").read_text())
        assert config == r["config"]
        assert json.loads((folder / "summary.json").read_text())["steps"] == 30
    table = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(table) == 8 and table[0]["model.attention"] == "softmax"
    store.close()

    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 0 and "0 to run in 0 ensembles" in err

    code, stdout, _ = run_cli(capsys, "results", str(out), "--where", "model.attention=relu",
                              "--where", "task.seq_len=12")
    assert code == 0 and stdout.count("model.attention=relu,task.seq_len=12") == 2
    assert "softmax" not in stdout
    code, _, err = run_cli(capsys, "results", str(out), "--where", "colour=red")
    assert code == 2 and "not a grid key of this sweep" in err
    code, stdout, _ = run_cli(capsys, "results", str(out), "--csv", str(tmp_path / "r.csv"))
    assert code == 0 and len((tmp_path / "r.csv").read_text().splitlines()) == 9


def test_a_queued_cell_is_pending_and_only_the_computed_one_running(tmp_path, capsys,
                                                                   monkeypatch):
    from sinklab.sweeps import run as run_mod

    spec, out = write(tmp_path, TINY.replace("seeds = 2", "seeds = 1")), tmp_path / "sw"
    seen = []
    compute = run_mod.compute

    def watched(job, plugins=()):
        store = Store.read(out)
        try:
            rows = {r["name"]: r["status"] for r in store.rows()}
        finally:
            store.close()
        seen.append(([name for name, _ in job], rows))
        return compute(job, plugins)

    monkeypatch.setattr(run_mod, "compute", watched)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 0, err
    assert len(seen) >= 2  # several ensembles, one at a time
    for computing, rows in seen:
        running = sorted(n for n, status in rows.items() if status == "running")
        assert running == sorted(computing), rows
        assert all(status in ("pending", "done") for n, status in rows.items()
                   if n not in computing)
    assert any("pending" in rows.values() for _, rows in seen)

    # a row a killed sweep left "running" is not running while no process writes the folder
    with sqlite3.connect(out / "sweep.db") as conn:
        conn.execute("UPDATE cells SET status = 'running' WHERE position = 0")
    code, listing, err = run_cli(capsys, "results", str(out))
    assert code == 0 and " running " not in listing and "0 running" in err
    assert listing.splitlines()[1].split()[1] == "pending"


def test_a_diverged_cells_metrics_are_blank_in_the_listing_and_the_csv(tmp_path, capsys):
    spec = write(tmp_path, """seeds = 1
[base]
model.attention = "relu"
train.max_steps = 30
task.seq_len = 8
[grid]
"train.lr" = [1e-3, 1e6]
""")
    out = tmp_path / "sw"
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 1, err
    store = Store.read(out)
    diverged = store.rows("failed")[0]
    store.close()
    assert diverged["metrics"]["bos_max"] is not None  # measured, and kept in the store
    code, listing, _ = run_cli(capsys, "results", str(out))
    assert code == 0
    head, ok, bad = listing.splitlines()
    columns = head.split()
    assert columns == ["cell", "status", "converged", "steps", "linf_error", "bos_max",
                       "sink_heads", "reason"]
    # the diverged row: its name, failed, converged False, its steps, then the reason at once
    assert bad.split()[:5] == [diverged["name"], "failed", "False",
                               str(diverged["metrics"]["steps"]), "diverged"]
    assert f"diverged at step {diverged['metrics']['steps']}: the loss is not finite" in bad
    assert len(ok.split()) == len(columns) - 1  # a done cell has every metric (no reason)
    table = {r["name"]: r for r in csv.DictReader((out / "results.csv").read_text()
                                                   .splitlines())}
    row = table[diverged["name"]]
    assert row["bos_max"] == row["linf_error"] == row["sink_heads"] == ""
    assert row["steps"] == str(diverged["metrics"]["steps"]) and row["converged"] == "False"
    assert all(table[n]["bos_max"] != "" for n in table if n != diverged["name"])
    code, _, _ = run_cli(capsys, "results", str(out), "--csv", str(tmp_path / "cells.csv"))
    assert code == 0 and (tmp_path / "cells.csv").read_text() == (out / "results.csv").read_text()


@pytest.mark.slow
def test_a_broken_sweep_store_or_marker_says_what_to_do_and_that_works(tmp_path, capsys):
    spec, out = write(tmp_path, TINY.replace("seeds = 2", "seeds = 1")), tmp_path / "sw"
    assert run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")[0] == 0
    marker = (out / "sinklab.json").read_text()
    (out / "sinklab.json").write_text("{torn")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 2 and err.count("\n") == 1, err
    assert f"delete {out / 'sinklab.json'} and run the sweep again with --out {out}" in err
    (out / "sinklab.json").unlink()  # as it says
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 0 and "0 to run" in err
    assert json.loads((out / "sinklab.json").read_text())["kind"] == json.loads(marker)["kind"]

    (out / "sweep.db").write_bytes(b"junk" * 1000)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 2 and err.count("\n") == 1, err
    assert "sweep.db is corrupted or not a sinklab database" in err
    assert "run the same `sinklab sweep` command with a new --out" in err
    assert (out / "sweep.db").read_bytes() == b"junk" * 1000  # the record is not replaced
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "new"))
    assert code == 0, err


def test_other_folders_are_refused_and_left_alone(tmp_path, capsys):
    spec = write(tmp_path, TINY)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(foreign))
    assert code == 2 and "is not an empty folder or a sinklab sweep folder" in err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sweep.db").write_bytes(b"not a database at all" * 100)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(broken))
    assert code == 2 and "sweep.db is corrupted or not a sinklab database" in err
    assert (broken / "sweep.db").read_bytes() == b"not a database at all" * 100

    half = tmp_path / "half"  # a sweep killed while creating its database
    half.mkdir()
    (half / ".sweep.db.creating").write_bytes(b"partial")
    loaded = spec_mod.load_spec(spec)
    Store.create_or_open(half, loaded, spec_mod.cells(loaded), "test").close()
    assert sorted(p.name for p in half.iterdir()) == ["sweep.db"]

    out = tmp_path / "sw"
    Store.create_or_open(out, loaded, spec_mod.cells(loaded), "test").close()
    other = write(tmp_path, TINY.replace("[8, 12]", "[8, 16]"), "other.toml")
    code, _, err = run_cli(capsys, "sweep", str(other), "--out", str(out))
    assert code == 2 and "holds another sweep" in err
    code, _, err = run_cli(capsys, "results", str(foreign))
    assert code == 2 and "is not a sweep folder" in err


@pytest.mark.slow
def test_a_diverging_cell_fails_with_its_reason_and_the_rest_finish(tmp_path, capsys):
    spec = write(tmp_path, """seeds = 1
[base]
model.attention = "relu"
train.max_steps = 30
[grid]
"train.lr" = [1e-3, 1e6]
"task.seq_len" = [8, 12]
""")
    out = tmp_path / "sw"
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "2")
    assert code == 1 and "--retry-failed" in err
    rows = {r["name"]: r for r in Store.read(out).rows()}
    failed = [r for r in rows.values() if r["status"] == "failed"]
    assert len(failed) == 2 and all("train.lr=1e+06" in r["name"] for r in failed)
    assert all(r["reason"].startswith("diverged at step") for r in failed)
    assert all(r["status"] == "done" for r in rows.values() if "lr=0.001" in r["name"])
    code, listing, _ = run_cli(capsys, "results", str(out), "--where", "train.lr=1e-3")
    assert code == 0 and listing.count("train.lr=0.001") == 2 and "1e+06" not in listing
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 1 and "0 to run" in err  # failed cells stay failed without the flag
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--retry-failed")
    assert code == 1 and "2 to run" in err
    rows = Store.read(out).rows("failed")
    assert [r["attempts"] for r in rows] == [2, 2]


@pytest.mark.slow
def test_sigkill_mid_sweep_then_resume_finishes_every_cell_once(tmp_path):
    spec = write(tmp_path, """seeds = 1
[base]
train.max_steps = 400
[grid]
"task.seq_len" = [8, 10, 12, 14, 16, 18, 20, 22]
""")
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "sinklab", "sweep", str(spec), "--out", str(out),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    done = 0
    while time.time() < deadline and done < 2:
        time.sleep(0.2)
        if (out / "sweep.db").is_file():
            with sqlite3.connect(out / "sweep.db") as conn:
                done = conn.execute("SELECT COUNT(*) FROM cells WHERE status = 'done'"
                                    ).fetchone()[0]
    assert done >= 2, "the sweep did not get going"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store.read(out)
    before = {r["name"]: r for r in store.rows()}
    store.close()
    finished_before = [n for n, r in before.items() if r["status"] == "done"]
    assert 2 <= len(finished_before) < 8
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    store = Store.read(out)
    rows = store.rows()
    assert [r["status"] for r in rows] == ["done"] * 8
    for r in rows:
        if r["name"] in finished_before:  # never run twice
            assert r["attempts"] == 1 and r["finished"] == before[r["name"]]["finished"]
        folder = out / "runs" / r["name"]
        for f in folder.glob("*.json"):
            json.loads(f.read_text())
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(r["name"] for r in rows)
    list(csv.DictReader((out / "results.csv").read_text().splitlines()))


# ------------------------------------------------------------------------------- Ray


def test_missing_ray_extra_is_one_sentence(tmp_path, capsys, monkeypatch):
    import importlib

    from sinklab.sweeps import run as run_mod

    real = importlib.import_module

    def no_ray(name, *a):
        if name == "ray":
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(run_mod.importlib, "import_module", no_ray)
    code, _, err = run_cli(capsys, "sweep", str(write(tmp_path, TINY)), "--out",
                           str(tmp_path / "o"), "--executor", "ray")
    assert code == 2 and "pip install 'sinklab[ray]'" in err and not (tmp_path / "o").exists()
    code, _, err = run_cli(capsys, "sweep", str(write(tmp_path, TINY)), "--out",
                           str(tmp_path / "o"), "--executor", "dask")
    assert code == 2 and "--executor 'dask' is not allowed: choose one of local, ray" in err


@pytest.mark.slow
def test_ray_and_local_executors_store_the_same_results(tmp_path, capsys, request):
    pytest.importorskip("ray")
    spec = write(tmp_path, TINY)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "local"),
                           "--workers", "2")
    assert code == 0, err
    request.getfixturevalue("local_ray")  # started after the local run, like a user's cluster
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "ray"),
                           "--executor", "ray", "--workers", "2")
    assert code == 0, err
    local = {r["name"]: r["metrics"] for r in Store.read(tmp_path / "local").rows()}
    remote = {r["name"]: r["metrics"] for r in Store.read(tmp_path / "ray").rows()}
    assert local.keys() == remote.keys() and len(local) == 8
    for name, metrics in local.items():
        for key, value in metrics.items():
            if key == "train_time_s":  # the only number that may differ
                continue
            if isinstance(value, float):
                assert remote[name][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, key)
            else:
                assert remote[name][key] == value, (name, key)


class FakeInit:
    """``ray.init`` and ``ray.shutdown`` recorded; ``init`` may hang (on an event, at most
    ``hang_s``, then it fails) the way a local Ray that never comes up does."""

    def __init__(self, hang_s: float = 0.0) -> None:
        import threading

        self.calls: list[dict] = []
        self.shutdowns = 0
        self.hang_s = hang_s
        self.release = threading.Event()

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if self.hang_s and not self.release.wait(self.hang_s):
            raise RuntimeError("the fake Ray gave up")

    def shutdown(self):
        self.shutdowns += 1


def fake_ray_start(monkeypatch, hang_s: float = 0.0) -> FakeInit:
    ray = pytest.importorskip("ray")
    fake = FakeInit(hang_s)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return fake


@pytest.mark.parametrize(("limit", "store"), [("1G", 256 * 2**20), ("100M", 75 * 2**20),
                                              ("64G", 2 * 2**30)])
def test_a_local_ray_object_store_follows_the_memory_limit(monkeypatch, limit, store):
    """A local Ray instance gets an object store of a quarter of SINKLAB_MAX_MEMORY, at most
    2 GiB and at least Ray's minimum of 75 MiB (Ray's own sizing, 30 % of the free memory,
    is 7 GB on a 23 GB machine, more than an 8 GB address-space cap leaves its workers); a
    cluster given by address keeps its own store."""
    from sinklab.sweeps import run as run_mod

    fake = fake_ray_start(monkeypatch)
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", limit)
    with run_mod.ray_session(None, 2):
        pass
    assert fake.calls[-1]["object_store_memory"] == store and fake.calls[-1]["num_cpus"] == 2
    with run_mod.ray_session("auto", 2):
        pass
    assert fake.calls[-1]["address"] == "auto" and "object_store_memory" not in fake.calls[-1]
    assert fake.shutdowns == 2


def test_ray_that_does_not_start_ends_in_one_sentence_and_writes_nothing(tmp_path, capsys,
                                                                         monkeypatch):
    """A ``ray.init`` that never returns (a local instance short of memory waits in silence)
    ends after SINKLAB_RAY_START_S seconds in one sentence, with Ray shut down and no folder
    written; a value that is no number of seconds is refused."""
    fake = fake_ray_start(monkeypatch, hang_s=20)
    monkeypatch.setenv("SINKLAB_RAY_START_S", "1")
    began = time.monotonic()
    try:
        code, _, err = run_cli(capsys, "sweep", str(write(tmp_path, TINY)), "--out",
                               str(tmp_path / "o"), "--executor", "ray")
    finally:
        fake.release.set()  # the fake start returns, so its thread ends
    assert time.monotonic() - began < 10
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("sinklab: error: Ray did not start within 1 s (SINKLAB_RAY_START_S); "
                          "a local instance that never comes up is usually short of memory"), err
    assert fake.shutdowns >= 1 and not (tmp_path / "o").exists()
    monkeypatch.setenv("SINKLAB_RAY_START_S", "soon")
    code, _, err = run_cli(capsys, "sweep", str(write(tmp_path, TINY)), "--out",
                           str(tmp_path / "o"), "--executor", "ray")
    assert code == 2 and "SINKLAB_RAY_START_S='soon' is not allowed" in err
    assert not (tmp_path / "o").exists()


def test_waiting_on_a_ray_cluster_with_no_cpu_left_ends_in_one_sentence(monkeypatch):
    """Waiting for results polls: while the cluster has an alive node with a CPU, a job may
    take as long as it takes; once none is left, the wait ends in one sentence."""
    from contextlib import ExitStack

    from sinklab.sweeps import run as run_mod

    class Cluster:
        def __init__(self):
            self.polls = self.waits = 0

        def remote(self, **options):
            return lambda fn: type("Task", (), {"remote": staticmethod(lambda *a: object())})

        def put(self, value):
            return value

        def wait(self, refs, num_returns, timeout=None):
            assert timeout is not None, "waited for Ray without a time limit"
            self.waits += 1
            assert self.waits < 10, "went on waiting for a cluster with no node left"
            return [], refs

        def nodes(self):
            self.polls += 1  # alive for the first three polls, then every node is gone
            return [{"Alive": self.polls <= 3, "Resources": {"CPU": 2.0}}]

    cluster = Cluster()
    monkeypatch.setattr(run_mod, "ray_module", lambda: cluster)
    monkeypatch.setattr(run_mod, "RAY_POLL_S", 0.0)
    jobs = [[("a", {})], [("b", {})]]
    with pytest.raises(run_mod.RayLost) as info:
        list(run_mod._ray_results(ExitStack(), jobs, ()))
    assert cluster.polls == 4
    assert str(info.value) == ("Ray has no alive node with a CPU left while 2 job(s) were "
                               "waiting (its nodes died or left the cluster); the cells that "
                               "finished are kept: run the same command again to run the "
                               "others.")


@pytest.mark.slow
def test_a_real_local_ray_starts_with_the_store_it_was_given(monkeypatch):
    """One real local start under a 400 MiB limit: the store is 100 MiB, and a task runs (Ray's
    processes outlive the thread that waited for the start)."""
    ray = pytest.importorskip("ray")
    from sinklab.sweeps import run as run_mod

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # else Ray writes ~/.ray/auth_token
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", "400M")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with run_mod.ray_session(None, 1):
        assert ray.cluster_resources()["object_store_memory"] == 100 * 2**20
        assert ray.get(ray.remote(num_cpus=1)(lambda: 7).remote(), timeout=120) == 7
    assert not ray.is_initialized()


# ---------------------------------------------------------------------------- report


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_report_gathers_every_result_into_markdown_and_a_self_contained_page(
        tmp_path, capsys, monkeypatch):
    import re

    from sinklab.studies import zoo

    monkeypatch.setattr(zoo, "QUICK_CAP", {"1x1": 20, "2x2": 10})
    root = tmp_path / "results"
    code, _, err = run_cli(capsys, "sweep", str(write(tmp_path, TINY)), "--out",
                           str(root / "sweep"), "--workers", "1")
    assert code == 0, err
    code, _, err = run_cli(capsys, "zoo", "--quick", "--rules", "softmax,relu",
                           "--workers", "1", "--out", str(root / "zoo"))
    assert code == 0, err
    code, stdout, err = run_cli(capsys, "report", str(root))
    assert code == 0, err
    assert "zoo" in stdout and "sweep" in stdout
    text = (root / "report" / "REPORT.md").read_text()
    # the zoo's report first, then the sweep's section, written from its store
    assert text.index("## Zoo: which attention rules need a sink (") < text.index("## Sweep (")
    assert "### Zoo: which attention rules need a sink" in text
    assert "`sinklab sweep " in text and "8 done" in text
    assert "- [Zoo: which attention rules need a sink (" in text  # the contents
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and all((root / "report" / link).resolve().is_file() for link in links)
    page = (root / "report" / "REPORT.html").read_text()
    assert "<script" not in page and 'class="toc"' in page and "<table>" in page
    assert page.count('src="data:image/png;base64,') == len(links)
    assert "http://" not in page and "https://" not in page


def test_report_of_a_folder_without_results_is_one_sentence(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "report", str(tmp_path / "empty"))
    assert code == 2 and "holds no sinklab results" in err
    code, _, err = run_cli(capsys, "report", str(tmp_path / "missing"))
    assert code == 2 and "is not a folder" in err


def test_progress_is_a_live_line_on_a_terminal_and_log_lines_otherwise(monkeypatch, capsys):
    from sinklab.sweeps.run import Progress

    lines: list[str] = []
    plain = Progress(total=4, done=1, failed=0, log=lines.append)
    plain.update(1, 1)
    plain.close()
    assert len(lines) == 1 and lines[0].startswith("sweep: 2 done, 1 failed, 4 cells; ETA")
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    live = Progress(total=4, done=1, failed=0, log=lines.append)
    live.update(2, 0)
    live.close()
    err = capsys.readouterr().err
    assert len(lines) == 1  # no log line: the bar shows it
    assert "3/4" in err and "done=3" in err and "failed=0" in err


# ------------------------------------------------------------------ what must not break


@pytest.mark.slow
def test_a_diverging_multi_head_cell_keeps_its_healthy_mates_and_resumes(tmp_path, capsys):
    # A 4x4 softmax cell at lr 10 diverges; its BOS masses are NaN (null in its summary). Its
    # ensemble-mate at lr 1e-4 is recorded as done, and a resume does not trip over either.
    spec = write(tmp_path, """seeds = 1
[base]
model.n_layers = 4
model.n_heads = 4
train.max_steps = 300
eval.n_sequences = 64
[grid]
"train.lr" = [1e-4, 10.0]
""")
    out = tmp_path / "sw"
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 1 and "Traceback" not in err, err
    rows = {r["name"]: r for r in Store.read(out).rows()}
    assert rows["train.lr=0.0001,seed=0"]["status"] == "done"
    assert rows["train.lr=0.0001,seed=0"]["metrics"]["steps"] == 300
    diverged = rows["train.lr=10,seed=0"]
    assert diverged["status"] == "failed" and diverged["reason"].startswith("diverged at step")
    assert diverged["metrics"]["bos_max"] is None
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--retry-failed")
    assert code == 1 and "1 to run" in err and "Traceback" not in err


def test_a_damaged_finished_cell_runs_again(tmp_path, capsys):
    spec, out = write(tmp_path, TINY.replace("seeds = 2", "seeds = 1")), tmp_path / "sw"
    assert run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")[0] == 0
    rows = Store.read(out).rows()
    model = out / rows[0]["path"] / "model.pt"
    intact = model.read_bytes()
    model.write_bytes(intact[:64])  # truncated, as by a full disk or a killed copy
    missing = out / rows[1]["path"]
    shutil.rmtree(missing)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 0, err
    assert f"{rows[0]['name']}: {model} is 64 bytes, not the {len(intact)}" in err
    assert f"{rows[1]['name']}: {missing} is missing or unfinished; it runs again" in err
    assert "2 to run" in err
    after = {r["name"]: r for r in Store.read(out).rows()}
    assert all(r["status"] == "done" for r in after.values())
    assert model.read_bytes() == intact  # the same seed gives the same bytes
    assert [after[r["name"]]["attempts"] for r in rows[:2]] == [2, 2]


def test_values_that_print_alike_and_long_names_get_folders_of_their_own(tmp_path, capsys):
    keys = "".join(f'"{k}" = [{v}]\n' for k, v in (
        ("train.lr", "1e-3, 1.0000001e-3"), ("train.beta1", "0.9"), ("train.beta2", "0.95"),
        ("train.adam_eps", "1e-8"), ("train.batch_size", "16"), ("eval.n_sequences", "8"),
        ("train.log_every", "7"), ("task.train_trigger_min", "2"), ("model.init_std", "0.02"),
        ("model.bos_cap_eps", "0.1"), ("task.no_trigger_prob", "0.0")))
    spec = write(tmp_path, f"[base]\ntrain.max_steps = 2\n[grid]\n{keys}")
    loaded = spec_mod.load_spec(spec)
    names = [c.name for c in spec_mod.cells(loaded)]
    assert len(names) == 2 and "train.lr=0.0010000001," in names[1]
    assert all(len(n) > 200 for n in names)  # longer than the folder names we allow
    out = tmp_path / "sw"
    assert run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")[0] == 0
    folders = sorted(p.name for p in (out / "runs").iterdir())
    assert len(folders) == 2 and all(len(f.encode()) <= spec_mod.NAME_BYTES for f in folders)
    assert [r["path"] for r in Store.read(out).rows()] == [
        f"runs/{spec_mod.folder_name(n)}" for n in names]


def test_ensembles_are_split_to_fit_the_memory_limit(monkeypatch):
    from sinklab.config import build_run_config
    from sinklab.runs import limits
    from sinklab.sweeps.plan import sweep_jobs

    rows = [{"name": f"s{s}", "config": build_run_config({"train": {"seed": s}}).to_dict()}
            for s in range(10)]
    assert [len(j.names) for j in sweep_jobs(rows, 1)] == [10]
    one = limits.run_bytes(build_run_config({}), 1)
    three = limits.run_bytes(build_run_config({}), 3)
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", str(three + (one - limits.RUN_BYTES) // 2))
    assert [len(j.names) for j in sweep_jobs(rows, 1)] == [3, 3, 3, 1]
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", str(one - 1))
    with pytest.raises(ConfigError, match="cell s0 .* needs about .* more than the limit"):
        sweep_jobs(rows, 1)


def test_the_default_worker_count_shrinks_to_fit_and_an_explicit_one_is_refused(monkeypatch):
    from sinklab.runs import limits

    job = 100 * 2**20
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", str(2 * job + 2 * limits.WORKER_BYTES))
    assert limits.workers_that_fit([job] * 4, 2, explicit=False) == 2
    assert limits.workers_that_fit([job] * 4, 4, explicit=False) == 2
    with pytest.raises(ConfigError, match="--workers 4 needs about .* use --workers 2 or fewer"):
        limits.workers_that_fit([job] * 4, 4, explicit=True)
    assert limits.workers_that_fit([job * 100], 1, explicit=True) == 1  # run_bytes refuses it
    # more workers than jobs is no request for memory, however many are asked for
    assert limits.workers_that_fit([job] * 2, 10**20, explicit=True) == 2


def test_a_sweep_folder_from_before_markers_is_adopted(tmp_path, capsys):
    spec, out = write(tmp_path, TINY.replace("seeds = 2", "seeds = 1")), tmp_path / "sw"
    assert run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")[0] == 0
    (out / "sinklab.json").unlink()
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 0 and "0 to run" in err
    assert json.loads((out / "sinklab.json").read_text())["kind"] == "sweep"


def test_an_edited_database_cannot_send_writes_outside_the_sweep(tmp_path, capsys):
    spec, out = write(tmp_path, TINY.replace("seeds = 2", "seeds = 1")), tmp_path / "sw"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    loaded = spec_mod.load_spec(spec)
    Store.create_or_open(out, loaded, spec_mod.cells(loaded), "test").close()
    (out / "sinklab.json").write_text('{"kind": "sweep", "format": 1}')
    with sqlite3.connect(out / "sweep.db") as conn:
        conn.execute("UPDATE cells SET path = '../victim' WHERE position = 0")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "1")
    assert code == 2 and "names the run folder '../victim', outside" in err
    assert (victim / "keep.txt").read_text() == "mine"


def test_report_embeds_only_the_gathered_figures_and_leaves_out_broken_folders(tmp_path, capsys):
    root = tmp_path / "results"
    rep = root / "rep"
    (rep / "figures").mkdir(parents=True)
    (rep / "sinklab.json").write_text('{"kind": "reproduce", "format": 1}')
    (rep / "figures" / "fig.png").write_bytes(b"\x89PNG fake figure")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG not part of the results")
    (rep / "REPORT.md").write_text(f"# r\n\n![ok](figures/fig.png)\n\n![no]({secret})\n\n"
                                   "![no](/etc/hostname)\n")
    broken = root / "broken"
    broken.mkdir()
    (broken / "sinklab.json").write_text("{not json")
    (root / "elsewhere").symlink_to(tmp_path)  # links are not followed
    code, stdout, err = run_cli(capsys, "report", str(root))
    assert code == 0, err
    assert "sinklab: left out:" in err and "broken/sinklab.json is corrupted" in err
    page = (root / "report" / "REPORT.html").read_text()
    assert page.count('src="data:image/png;base64,') == 1
    assert str(secret) in page and "/etc/hostname" in page  # linked, not embedded
