"""A study's run refuses what it is given before it plans, prints or writes anything: limit
settings that are not allowed, runs and workers that do not fit in memory (named as the user gave
them), and config-file strings where a number or a boolean belongs. A study ends with the time it
took; SIGTERM ends any command as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sinklab import studies
from sinklab.cli import main
from sinklab.errors import ConfigError
from sinklab.studies.options import build_options


def refused(capsys, tmp_path: Path, argv: list[str]) -> str:
    """Run ``argv`` (a study writing into tmp_path/out) and return its one error line, checking
    that it exits with 2, printed nothing else (no plan: "N runs to train") and wrote nothing."""
    code = main([*argv, "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("sinklab: error: ") and "runs to train" not in captured.err
    assert not (tmp_path / "out").exists()
    return captured.err


@pytest.mark.parametrize("name, value, says", [
    ("SINKLAB_MAX_MEMORY", "abc", "SINKLAB_MAX_MEMORY='abc' is not allowed"),
    ("SINKLAB_MAX_MEMORY", "1M", "of memory, more than the limit of 1 MiB"),
    ("SINKLAB_MAX_CELLS", "lots", "SINKLAB_MAX_CELLS='lots' is not allowed"),
], ids=["memory-not-a-size", "memory-too-small", "cells-not-a-number"])
def test_limit_settings_are_checked_before_the_plan(capsys, tmp_path, monkeypatch, name, value,
                                                     says):
    monkeypatch.setenv(name, value)
    assert says in refused(capsys, tmp_path, ["pretrain", "--quick"])


@pytest.mark.parametrize("study", ["reproduce", "theory", "zoo", "extensions", "pretrain"])
def test_workers_that_do_not_fit_are_named_as_given_before_the_plan(capsys, tmp_path,
                                                                     monkeypatch, study):
    # four quick jobs side by side (each worker about 400 MiB) do not fit in 1 GiB
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", "1G")
    err = refused(capsys, tmp_path, [study, "--quick", "--workers", "1000"])
    assert "--workers 1000 would run " in err and "jobs side by side" in err, err
    assert "or fewer" in err


def test_workers_that_fit_are_not_refused_by_the_check(tmp_path, monkeypatch):
    from sinklab.studies.runner import check_fits
    from sinklab.studies.study import Execution

    zoo = studies.get("zoo")
    opts = build_options(zoo, flags={"quick": True})
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", "64G")
    check_fits(tmp_path, zoo.cells(opts, Execution(workers=1000)), Execution(workers=1000))
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", "1G")
    with pytest.raises(ConfigError, match="--workers 1000 would run"):
        check_fits(tmp_path, zoo.cells(opts, Execution(workers=1000)), Execution(workers=1000))


# ------------------------------------------------------------------------ config file types


@pytest.mark.parametrize("line, says", [
    ('seeds = "5"', "[zoo] seeds = '5' is a string; write an integer: seeds = 5 (or \"auto\")."),
    ('quick = "yes"', "[zoo] quick = 'yes' is a string; write true or false: quick = true."),
    ('quick = "maybe"', "[zoo] quick = 'maybe' is a string; write true or false without quotes."),
    ('screen_seeds = "two"', "[zoo] screen_seeds = 'two' is a string; write an integer without "
                             "quotes, or \"auto\"."),
], ids=["number", "boolean", "not-a-boolean", "not-a-number"])
def test_a_config_file_string_is_no_number_or_boolean(capsys, tmp_path, monkeypatch, line,
                                                     says):
    monkeypatch.setenv("SINKLAB_MAX_CELLS", "1")  # a study that took the string stops at once
    config = tmp_path / "x.toml"
    config.write_text(f"[zoo]\n{line}\n")
    err = refused(capsys, tmp_path, ["zoo", "--config", str(config)])
    assert f"config file {str(config)!r}: {says}" in err, err


@pytest.mark.parametrize("line, says", [
    ('eps = "0.1, 0.2"', "[theory] eps = '0.1, 0.2' is a string; write a list of numbers: "
                         "eps = [0.1, 0.2]."),
    ('eps = ["0.1", 0.2]', "[theory] eps = ['0.1', 0.2] holds a string; write a list of "
                           "numbers: eps = [0.1, 0.2]."),
], ids=["string", "list-with-a-string"])
def test_a_config_file_string_is_no_list_of_numbers(capsys, tmp_path, monkeypatch, line, says):
    monkeypatch.setenv("SINKLAB_MAX_CELLS", "1")  # a study that took the string stops at once
    config = tmp_path / "x.toml"
    config.write_text(f"[theory]\n{line}\n")
    err = refused(capsys, tmp_path, ["theory", "--config", str(config)])
    assert f"config file {str(config)!r}: {says}" in err, err


def test_strings_on_the_command_line_and_typed_file_values_are_still_read(tmp_path):
    zoo = studies.get("zoo")
    config = tmp_path / "x.toml"
    config.write_text('[zoo]\nseeds = 5\nquick = true\nscreen_seeds = "auto"\n'
                      'rules = "softmax, relu"\n[theory]\neps = [0.1, 0.2]\n')
    opts = build_options(zoo, str(config))
    assert (opts.seeds, opts.quick, opts.rules) == (5, True, ("softmax", "relu"))
    assert build_options(studies.get("theory"), str(config)).eps == (0.1, 0.2)
    opts = build_options(zoo, overrides=["zoo.seeds=4", "zoo.quick=yes"])
    assert (opts.seeds, opts.quick) == (4, True)
    assert build_options(zoo, flags={"seeds": "3"}).seeds == 3


# ------------------------------------------------------------------------------ time taken


@pytest.mark.parametrize("seconds, text", [(4.24, "4.2 s"), (42, "42 s"), (59.6, "1 min 00 s"),
                                           (102, "1 min 42 s"), (185, "3 min 05 s"),
                                           (3725, "1 h 02 min")])
def test_durations_read_as_minutes_and_seconds(seconds, text):
    from sinklab.cli import duration

    assert duration(seconds) == text


# ----------------------------------------------------------------------------------- SIGTERM


def _stopped_by_sigterm(tmp_path: Path, argv: list[str], ready: Callable[[], bool],
                        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Start ``python -m sinklab ARGV``, wait until ``ready()``, send it SIGTERM and return what
    it did."""
    process = subprocess.Popen([sys.executable, "-m", "sinklab", *argv], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command did not start in a minute"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _logging(path: Path) -> bool:
    """Whether ``path`` (a metrics.jsonl) has its first row: the run is in its training loop."""
    return path.is_file() and path.stat().st_size > 0


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_sigterm_ends_a_training_run_as_an_interrupt(tmp_path):
    out = tmp_path / "run"
    done = _stopped_by_sigterm(tmp_path, ["train", "train.max_steps=1000000", "--out", str(out)],
                               lambda: _logging(out / "metrics.jsonl"))
    assert done.returncode == 130, done.stderr
    assert done.stderr == "sinklab: interrupted; finished runs are kept on disk.\n"


@pytest.mark.slow
def test_sigterm_stops_a_study_and_its_workers_without_leaking(tmp_path):
    # stopped while two worker processes train, each in its scratch folder under TMPDIR (a
    # worker's progress bar once left a semaphore behind: "leaked semaphore objects")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def training() -> bool:
        return sum(map(_logging, scratch.glob("sinklab-sweep-*/cell*/metrics.jsonl"))) >= 2

    done = _stopped_by_sigterm(
        tmp_path, ["reproduce", "--quick", "--workers", "2", "--out", str(tmp_path / "out")],
        training, env={"TMPDIR": str(scratch)})
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1] == "sinklab: interrupted; finished runs are kept on disk."
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
