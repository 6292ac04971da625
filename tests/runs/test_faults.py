"""Faults as they happen in practice: a writer killed while it holds a folder's lock, two sweeps
started on one folder at the same moment, a sweep's driver killed under its workers, and a Ray
worker killed in the middle of a sweep. Each test starts real processes and kills them with
SIGKILL; none of them leaves a process behind.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import holder, run_cli, stop
from sinklab.runs import folders
from sinklab.sweeps.store import Store

SLOW_SPEC = """seeds = 2
[base]
train.max_steps = 400
eval.n_sequences = 64
[grid]
"task.seq_len" = [8, 10, 12, 14]
"""


def spec(tmp_path: Path, text: str = SLOW_SPEC) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def sinklab(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sinklab", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_a_writer_that_has_just_taken_the_lock_is_named_by_pid(tmp_path):
    # the moment between a writer's taking the lock and writing its holder file: the second
    # writer waits for the name (two sweeps started together once met it here)
    import json
    import socket

    from filelock import FileLock

    folder = tmp_path / "o"
    folder.mkdir()
    lock = FileLock(str(folder / folders.LOCK), timeout=0)
    lock.acquire()
    holder = {"pid": 4242, "host": socket.gethostname(), "command": "sinklab sweep s.toml"}
    late = threading.Timer(0.3, lambda: (folder / folders.HOLDER).write_text(json.dumps(holder)))
    late.start()
    try:
        with pytest.raises(folders.ResultsError,
                           match=r"another sinklab process \(pid 4242, `sinklab sweep s.toml`\)"):
            with folders.hold(folder):
                pass
        (folder / folders.HOLDER).unlink()  # a holder that never names itself is said so
        with pytest.raises(folders.ResultsError, match="it has not recorded its process id"):
            with folders.hold(folder):
                pass
    finally:
        late.join()
        lock.release()


def test_a_folder_claimed_between_looking_for_its_marker_and_listing_it_is_that_kind(
        tmp_path, monkeypatch):
    # the moment in check_writable between reading the marker (none yet) and listing the folder
    # (another writer has marked it and written its store since): the folder is a sweep folder,
    # so the second writer goes on to the lock, which names the first; one claimed in that
    # moment as a sweep is refused to a run by its kind; a stranger's files are still refused
    real = folders.kind_of

    def claimed_during_the_first_look(folder):
        looks = []

        def kind_of(path):
            looks.append(path)
            found = real(path)
            if len(looks) == 1:  # nothing there yet; then the other writer claims the folder
                folders.mark(path, "sweep")
                (path / folders.STORE).write_bytes(b"")
            return found

        folder.mkdir()
        monkeypatch.setattr(folders, "kind_of", kind_of)
        return looks

    looks = claimed_during_the_first_look(tmp_path / "a")
    folders.check_writable(tmp_path / "a", "sweep")
    assert len(looks) == 2
    looks = claimed_during_the_first_look(tmp_path / "b")
    with pytest.raises(folders.ResultsError, match="is a sinklab sweep folder, not a run folder"):
        folders.check_writable(tmp_path / "b", "run")
    assert len(looks) == 2
    monkeypatch.setattr(folders, "kind_of", real)
    stranger = tmp_path / "theirs"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine\n")
    with pytest.raises(folders.ResultsError, match="is not an empty folder or a sinklab"):
        folders.check_writable(stranger, "sweep")


def test_a_second_writer_is_refused_by_pid_and_a_killed_holder_leaves_no_lock(tmp_path, capsys):
    out = tmp_path / "run"
    proc = holder(out, "run")
    try:
        code, _, err = run_cli(capsys, "train", "train.max_steps=5", "eval.n_sequences=8",
                               "--out", str(out))
        assert code == 2 and err.count("\n") == 1
        assert f"{out} is being written by another sinklab process (pid {proc.pid}," in err
        assert sorted(p.name for p in out.iterdir()) == [".sinklab.lock", ".sinklab.lock.json",
                                                         "sinklab.json"]
    finally:
        stop(proc)
    # The holder died without releasing anything: its lock file and holder record are still
    # there, but the operating system dropped the lock, so the next writer takes it.
    assert (out / ".sinklab.lock.json").is_file()
    code, stdout, err = run_cli(capsys, "train", "train.max_steps=5", "eval.n_sequences=8",
                                "--out", str(out))
    assert code == 0, err
    assert "stopped without converging at 5 steps" in stdout
    assert not (out / ".sinklab.lock.json").exists()  # released by the writer that finished


def test_the_experiment_commands_and_report_take_the_lock_too(tmp_path, capsys):
    found = tmp_path / "results" / "rep"  # something for the report to gather
    found.mkdir(parents=True)
    (found / "sinklab.json").write_text('{"kind": "reproduce", "format": 1}')
    (found / "REPORT.md").write_text("# a report\n")
    for kind, argv in (("zoo", ["zoo", "--quick", "--rules", "relu"]),
                       ("reproduce", ["reproduce", "--quick"]),
                       ("theory", ["theory", "--quick"]),
                       ("report", ["report", str(found.parent)])):  # lm: tests/test_lm.py
        out = tmp_path / kind
        proc = holder(out, kind)
        try:
            code, _, err = run_cli(capsys, *argv, "--out", str(out))
        finally:
            stop(proc)
        assert code == 2 and f"{out} is being written by another sinklab process (pid " \
            f"{proc.pid}," in err, (kind, err)


def test_theory_locks_the_reproduce_folder_it_links_into(tmp_path, capsys):
    rdir = tmp_path / "rep"
    proc = holder(rdir, "reproduce")
    (rdir / "summary.json").write_text('{"runs": []}')
    try:
        code, _, err = run_cli(capsys, "theory", "--reproduce", str(rdir), "--quick", "--out",
                               str(tmp_path / "theory"))
    finally:
        stop(proc)
    assert code == 2 and f"{rdir} is being written by another sinklab process (pid {proc.pid}" \
        in err
    assert not (tmp_path / "theory").exists()  # refused before anything was written


@pytest.mark.slow
def test_a_folder_caught_while_another_writer_claims_it_is_not_someone_elses(tmp_path):
    """The first writer's holder file and marker are written through temporary files: a second
    writer that looks in that moment sees a folder being claimed (and then waits on its lock),
    not a folder of someone else's; any other file still makes the folder foreign."""
    from sinklab.runs import folders
    from sinklab.runs.files import temporary_path

    for name in (folders.HOLDER, folders.MARKER):
        folder = tmp_path / name.strip(".")
        folder.mkdir()
        (folder / folders.LOCK).touch()
        temporary_path(folder / name).touch()
        folders.check_writable(folder, "sweep")  # no error
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".notes.1.abcdef12.tmp").touch()
    with pytest.raises(folders.ResultsError, match="is not an empty folder"):
        folders.check_writable(mine, "sweep")


@pytest.mark.slow
def test_two_sweeps_started_together_one_runs_one_is_refused(tmp_path):
    path, out = spec(tmp_path), tmp_path / "sw"
    procs = [sinklab("sweep", str(path), "--out", str(out), "--workers", "1") for _ in range(2)]
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err) for p, _, err in results]
    (winner,) = [p for p, _, _ in results if p.returncode == 0]
    (_, _, refused), = [r for r in results if r[0].returncode == 2]
    assert refused.count("\n") == 1
    assert f"is being written by another sinklab process (pid {winner.pid}," in refused
    store = Store.read(out)
    rows = store.rows()
    store.close()
    assert [r["status"] for r in rows] == ["done"] * 8
    assert all(r["attempts"] == 1 for r in rows)  # no cell was reset or trained twice
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(r["name"] for r in rows)


def _workers(pid: int) -> list:
    import psutil

    return [c for c in psutil.Process(pid).children(recursive=True)
            if "resource_tracker" not in " ".join(c.cmdline())]


@pytest.mark.slow
def test_killing_a_sweep_driver_ends_its_worker_processes(tmp_path):
    psutil = pytest.importorskip("psutil")
    import tempfile

    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("sinklab-sweep-*"))
    long_spec = SLOW_SPEC.replace("400", "20000")
    proc = sinklab("sweep", str(spec(tmp_path, long_spec)), "--out", str(tmp_path / "sw"),
                   "--workers", "2")
    try:
        deadline = time.time() + 60
        workers = []
        while time.time() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = _workers(proc.pid)
        assert len(workers) == 2, "the sweep did not start its workers"
        time.sleep(1.0)  # both are training now
        proc.kill()  # SIGKILL to the driver alone: it cannot stop its pool
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers still running 10 s after their driver died: {alive}"
        # and the temporary folders of the jobs they were training went with them
        assert set(scratch.glob("sinklab-sweep-*")) <= before
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_ray_worker_killed_mid_sweep_loses_nothing(tmp_path, capsys, request):
    pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    text = SLOW_SPEC.replace("400", "1500").replace("[8, 10, 12, 14]", "[8, 12]")
    path = spec(tmp_path, text)
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "local"),
                           "--workers", "2")
    assert code == 0, err

    killed: list[int] = []

    def kill_one_task() -> None:  # a running task's worker shows "ray::compute" as its name
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            for p in psutil.process_iter(["pid", "cmdline"]):
                if "ray::compute" in " ".join(p.info["cmdline"] or []):
                    time.sleep(0.5)  # well inside its training
                    try:
                        p.send_signal(signal.SIGKILL)
                        killed.append(p.pid)
                    except psutil.NoSuchProcess:
                        continue
                    return
            time.sleep(0.1)

    request.getfixturevalue("local_ray")
    killer = threading.Thread(target=kill_one_task, daemon=True)
    killer.start()
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "ray"),
                           "--executor", "ray", "--workers", "2")
    killer.join(timeout=5)
    assert killed, "no Ray task was running to be killed"
    assert code == 0, err
    local = {r["name"]: r for r in Store.read(tmp_path / "local").rows()}
    remote = {r["name"]: r for r in Store.read(tmp_path / "ray").rows()}
    assert local.keys() == remote.keys() and len(remote) == 4
    for name, row in remote.items():
        assert row["status"] == "done" and row["attempts"] == 1  # done exactly once
        for key, value in local[name]["metrics"].items():
            if key != "train_time_s":
                assert row["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    with sqlite3.connect(tmp_path / "ray" / "sweep.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 4


def test_a_folder_inside_one_being_written_is_refused(tmp_path, capsys):
    out = tmp_path / "seeds"
    proc = holder(out, "runs")  # as `sinklab train --seeds N --out seeds` holds it
    try:
        code, _, err = run_cli(capsys, "train", "train.max_steps=3", "--out", str(out / "seed0"))
    finally:
        stop(proc)
    assert code == 2 and f"is inside {out}, which is being written by another sinklab " \
        f"process (pid {proc.pid}," in err
    assert not (out / "seed0").exists()
    run = tmp_path / "run"  # and nothing goes inside a run folder
    assert run_cli(capsys, "train", "train.max_steps=2", "eval.n_sequences=8", "--out",
                   str(run))[0] == 0
    code, _, err = run_cli(capsys, "train", "--out", str(run / "nested"))
    assert code == 2 and f"is inside the run folder {run}" in err


DYING_RULE = """import multiprocessing, os
from sinklab.attention import register, softmax


@register("dies_on_workers", row_kind="simplex")
def dies_on_workers(scores, mask):
    \"\"\"Softmax in the driver; on a worker process, the process dies (as if killed).\"\"\"
    if multiprocessing.parent_process() is not None:
        os._exit(9)
    return softmax(scores, mask)
"""


@pytest.mark.slow
def test_a_worker_that_keeps_dying_fails_its_cells_and_the_queued_ones_still_run(tmp_path):
    """A job whose worker process dies breaks the pool; the jobs in it run again in a fresh one
    (twice at most, then their cells fail with the reason), and the jobs that had not been
    handed to a worker yet wait for the fresh pool without losing a try."""
    rules = tmp_path / "dying.py"
    rules.write_text(DYING_RULE)
    path, out = spec(tmp_path, """seeds = 1
[base]
train.max_steps = 20
eval.n_sequences = 16
task.seq_len = 8
[grid]
"model.attention" = ["dies_on_workers", "softmax", "relu", "relu_power"]
"""), tmp_path / "sw"
    proc = sinklab("--plugin", str(rules), "--plugin", "plugin_rules", "sweep", str(path),
                   "--out", str(out), "--workers", "2",
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})  # tests/
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        stop(proc)
    assert proc.returncode == 1, err
    store = Store.read(out)
    rows = {r["overrides"]["model.attention"]: r for r in store.rows()}
    store.close()
    dying = rows.pop("dies_on_workers")
    assert dying["status"] == "failed" and dying["attempts"] == 3
    assert dying["reason"] == "its worker process died 3 times (killed, or out of memory)"
    assert all(r["status"] == "done" for r in rows.values()), rows
    # a job lost beside the dying one runs again alone, so it is never lost twice
    assert all(1 <= r["attempts"] <= 2 for r in rows.values())
