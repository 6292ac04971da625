"""Every kind of bad input, across every command, costs one sentence and nothing else.

One row per kind of bad input: a value out of range or absurdly large, an unknown rule or key, a
missing, foreign, corrupted or non-UTF-8 file, a folder that is not sinklab's, a file system
that refuses the write. Each row runs the command in-process and checks that it exits non-zero
with exactly one line on stderr, ``sinklab: error: ...``, that names the offending value or
path, shows no traceback, and that nothing under the test's folder changed except the run's own
folder where a row allows it. ``KINDS`` counts the kinds covered.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sinklab.cli import main

TINY_SPEC = '[base]\ntrain.max_steps = 5\n[grid]\n"model.attention" = ["softmax", "relu"]\n'


@dataclass(frozen=True)
class Case:
    kind: str  # what sort of bad input this is (rows of one kind share it)
    argv: Callable[[Path], list[str]]  # builds what it needs under the folder, returns argv
    says: str  # the sentence must contain this; "{tmp}" is the test's folder
    changes: tuple[str, ...] = ()  # paths under the folder that may change
    env: dict[str, str] = field(default_factory=dict)


def train(*args: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["train", *args, "--out", str(tmp / "o")]


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def marked(tmp: Path, name: str, kind: str | None, **extra: object) -> Path:
    import json

    folder = tmp / name
    folder.mkdir(parents=True)
    marker = {"format": 1} | ({"kind": kind} if kind else {}) | extra
    (folder / "sinklab.json").write_text(json.dumps(marker))
    return folder


def finished_run(tmp: Path) -> list[str]:
    assert main(["train", "train.max_steps=2", "eval.n_sequences=8", "--out",
                 str(tmp / "done")]) == 0
    return ["train", "--out", str(tmp / "done")]


def damaged_run(tmp: Path) -> list[str]:
    finished_run(tmp)
    (tmp / "done" / "model.pt").write_bytes(b"junk")
    return ["plot", str(tmp / "done")]


def seeds_with_an_unfinished_run(tmp: Path) -> list[str]:
    marked(tmp, "seeds", "runs")
    marked(tmp, "seeds/seed0", "run")
    return ["plot", str(tmp / "seeds")]


def spec_file(data: str | bytes) -> Callable[[Path], list[str]]:
    return lambda tmp: ["sweep", str(write(tmp, "spec.toml", data)), "--out", str(tmp / "o")]


def tiny_sweep(tmp: Path) -> Path:
    """A finished two-cell sweep folder."""
    out = tmp / "sw"
    assert main(["sweep", str(write(tmp, "s.toml", TINY_SPEC)), "--out", str(out), "--workers",
                 "1"]) == 0
    return out


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe")
    return tmp / "pipe"


def read_only(tmp: Path) -> list[str]:
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)
    return ["train", "train.max_steps=2", "--out", str(tmp / "ro" / "o")]


def full_disk(tmp: Path) -> list[str]:
    """An interrupted run folder whose metrics log is /dev/full: every write to it fails with
    ENOSPC, as on a full disk."""
    folder = marked(tmp, "o", "run")
    (folder / "metrics.jsonl").symlink_to("/dev/full")
    return ["train", "train.max_steps=2", "eval.n_sequences=8", "--out", str(folder)]


HUGE_GRID = "[grid]\n" + "".join(
    f'"{key}" = [{", ".join(str(v) for v in range(8, 28))}]\n'
    for key in ("task.seq_len", "task.d_model", "train.batch_size", "train.max_steps",
                "train.log_every", "eval.n_sequences", "eval.seed", "model.n_heads"))

CASES: dict[str, Case] = {
    # values
    "unknown key": Case("unknown key", train("bogus.key=1"), "unknown override key 'bogus.key'"),
    "unknown rule": Case("unknown rule", train("model.attention=sigmoidish"),
                         "model.attention='sigmoidish' is not a known attention rule"),
    "out of range": Case("value out of range", train("task.seq_len=3"),
                         "task.seq_len=3 is not allowed"),
    "rule argument unknown": Case("unknown key", train("model.attention_args.temp=2"),
                                  "model.attention_args.temp='2' is not allowed: attention rule "
                                  "'softmax' takes the keyword argument temperature."),
    "rule argument of another rule": Case("unknown key", train(
        "model.attention=relu", "model.attention_args.temperature=2"),
        "attention rule 'relu' takes no keyword arguments"),
    "rule argument type": Case("value of the wrong type", train(
        "model.attention_args.temperature=warm"),
        "model.attention_args.temperature='warm' is not allowed: it must be a number."),
    "rule argument range": Case("value out of range", train(
        "model.attention_args.temperature=0"),
        "model.attention_args.temperature=0.0 is not allowed: softmax's temperature must be a "
        "number > 0."),
    "rule argument in a file": Case("value of the wrong type", lambda tmp: [
        "train", "--config", str(write(tmp, "run.toml", "[model]\nattention = 'sigmoid'\n"
                                                        "[model.attention_args]\nbias = 'low'\n")),
        "--out", str(tmp / "o")], "model.attention_args.bias='low' is not allowed"),
    "trigger out of range": Case("value out of range", train("task.seq_len=8",
                                                             "task.eval_trigger=8"),
                                 "task.eval_trigger=8 is not allowed"),
    "wrong type": Case("value of the wrong type", train("task.seq_len=abc"),
                       "task.seq_len='abc' is not allowed: it must be an integer"),
    "tol inf": Case("non-finite value", train("train.tol=inf"),
                    "train.tol=inf is not allowed: it must be a finite number"),
    "lr inf": Case("non-finite value", train("train.lr=inf"), "train.lr=inf is not allowed"),
    "init_std inf": Case("non-finite value", train("model.init_std=inf"),
                         "model.init_std=inf is not allowed"),
    "adam_eps nan": Case("non-finite value", train("train.adam_eps=nan"),
                         "train.adam_eps=nan is not allowed"),
    "device": Case("unknown device", train("train.device=tpu"),
                   "train.device='tpu' is not allowed"),
    "device index": Case("unknown device", train("train.device=cuda:x"),
                         "train.device='cuda:x' is not allowed"),
    "flag not a number": Case("flag value of the wrong type", train("--seeds", "abc"),
                              "argument --seeds: invalid int value: 'abc'"),
    "flag zero": Case("flag value out of range", train("--seeds", "0"),
                      "--seeds=0 is not allowed"),
    "workers zero": Case("flag value out of range",
                         lambda tmp: ["reproduce", "--workers", "0", "--out", str(tmp / "o")],
                         "--workers=0 is not allowed"),
    "unknown flag": Case("unknown flag", train("--colour", "red"),
                         "unrecognized arguments: --colour"),
    "unknown command": Case("unknown command", lambda tmp: ["frobnicate"],
                            "invalid choice: 'frobnicate'"),
    "empty path": Case("empty value", train("--out", ""),
                       "argument --out: an empty value is not allowed"),
    "empty config": Case("empty value", train("--config", ""),
                         "argument --config: an empty value is not allowed"),
    "non-ASCII digits": Case("value of the wrong type", train("train.batch_size=١٢"),
                             "train.batch_size='١٢' is not allowed: it must be an integer"),
    "seed too large": Case("value out of range", spec_file(
        "seeds = [100000000000000000000000]\n" + TINY_SPEC),
        "train.seed=100000000000000000000000 is not allowed"),
    "eps twice": Case("value given twice", lambda tmp: [
        "theory", "--eps", "0.1,0.1", "--out", str(tmp / "o")], "--eps lists 0.1 twice"),
    "rule twice": Case("value given twice", lambda tmp: [
        "zoo", "--rules", "relu,relu", "--out", str(tmp / "o")], "--rules lists 'relu' twice"),
    "model twice": Case("value given twice", lambda tmp: [
        "lm", "--model", str(tmp), "--model", str(tmp), "--out", str(tmp / "o")],
        "is given twice; give each model once"),
    "lm device": Case("unknown device", lambda tmp: [
        "lm", "--device", "gpu", "--out", str(tmp / "o")], "--device 'gpu' is not allowed"),
    "reproduce device": Case("unknown device", lambda tmp: [
        "reproduce", "--device", "tpu", "--out", str(tmp / "o")],
        "--device 'tpu' is not allowed"),
    "unknown executor": Case("unknown executor",
                             lambda tmp: ["sweep", str(write(tmp, "s.toml", TINY_SPEC)),
                                          "--out", str(tmp / "o"), "--executor", "dask"],
                             "--executor 'dask' is not allowed"),
    "zoo rule": Case("unknown rule", lambda tmp: ["zoo", "--rules", "softmax,nope", "--out",
                                                  str(tmp / "o")],
                     "--rules: 'nope' is not a known attention rule"),
    "spec rule": Case("unknown rule", spec_file(TINY_SPEC.replace('"relu"', '"relu_pow"')),
                      "spec.toml: grid key 'model.attention' (line 4): 'relu_pow' is not a "
                      "registered attention rule: choose one of "),
    # plugins (sinklab.plugins)
    "plugin module missing": Case("missing plugin", lambda tmp: [
        "rules", "--plugin", "mylab.no_such_rules"],
        "--plugin mylab.no_such_rules: no module named 'mylab' can be imported; give the path of "
        "a .py file, or install the module"),
    "plugin file missing": Case("missing plugin", lambda tmp: [
        "train", "--plugin", str(tmp / "rules.py"), "--out", str(tmp / "o")],
        "--plugin {tmp}/rules.py: {tmp}/rules.py does not exist; give the path of a .py file or "
        "an importable module name"),
    "plugin not a name": Case("missing plugin", lambda tmp: ["rules", "--plugin", "my-rules"],
                              "--plugin 'my-rules' is neither a .py file nor a module name"),
    "plugin raises": Case("plugin that fails", lambda tmp: [
        "sweep", str(write(tmp, "s.toml", TINY_SPEC)), "--out", str(tmp / "o"), "--plugin",
        str(write(tmp, "rules.py", "raise RuntimeError('needs a GPU\\nsee the docs')\n"))],
        "--plugin {tmp}/rules.py could not be loaded: RuntimeError: needs a GPU."),
    "plugin syntax": Case("plugin that fails", lambda tmp: [
        "rules", "--plugin", str(write(tmp, "rules.py", "def rule(:\n"))],
        "--plugin {tmp}/rules.py could not be loaded: SyntaxError: "),
    "plugin takes a name": Case("plugin that fails", lambda tmp: [
        "rules", "--plugin", str(write(tmp, "rules.py", (
            "from sinklab.attention import register\n"
            "@register('relu', row_kind='free')\n"
            "def mine(scores, mask):\n    return scores\n")))],
        "--plugin {tmp}/rules.py could not be loaded: ValueError: attention rule 'relu' is "
        "already registered (by sinklab); register the one in {tmp}/rules.py under another "
        "name."),
    "plugin in the environment": Case("missing plugin", lambda tmp: ["rules"],
                                      "nowhere_rules (in SINKLAB_PLUGINS): no module named "
                                      "'nowhere_rules' can be imported",
                                      env={"SINKLAB_PLUGINS": "nowhere_rules"}),
    "results status": Case("flag value out of range",
                           lambda tmp: ["results", str(tiny_sweep(tmp)), "--status", "sleeping"],
                           "--status 'sleeping' is not allowed"),
    "results where": Case("flag value of the wrong type",
                          lambda tmp: ["results", str(tiny_sweep(tmp)), "--where", "seed"],
                          "--where 'seed' is not of the form key=value"),
    # files
    "config missing": Case("missing file", train("--config", "/nonexistent/run.toml"),
                           "config file '/nonexistent/run.toml' does not exist"),
    "config is a folder": Case("folder given as a file", lambda tmp: [
        "train", "--config", str(tmp), "--out", str(tmp / "o")], "is a folder, not a TOML file"),
    "config not UTF-8": Case("file not UTF-8", lambda tmp: [
        "train", "--config", str(write(tmp, "run.toml", b"[task]\nseq_len = 8 # \xff\xfe\n")),
        "--out", str(tmp / "o")], "run.toml' is not UTF-8 text"),
    "config not TOML": Case("file not TOML", lambda tmp: [
        "train", "--config", str(write(tmp, "run.toml", "[task\n")), "--out", str(tmp / "o")],
        "run.toml' is not valid TOML"),
    "config wrong table": Case("unknown key", lambda tmp: [
        "train", "--config", str(write(tmp, "run.toml", "[tasks]\nseq_len = 8\n")),
        "--out", str(tmp / "o")], "unknown config section 'tasks'"),
    "spec missing": Case("missing file", lambda tmp: ["sweep", str(tmp / "none.toml"), "--out",
                                                      str(tmp / "o")], "none.toml' does not exist"),
    "spec is a folder": Case("folder given as a file",
                             lambda tmp: ["sweep", str(tmp), "--out", str(tmp / "o")],
                             "is a folder, not a TOML file"),
    "spec not UTF-8": Case("file not UTF-8", spec_file(b'description = "\xe9t\xe9"\n'),
                           "spec.toml' is not UTF-8 text (byte 15 cannot be decoded)"),
    "spec bad value": Case("value out of range", spec_file(TINY_SPEC.replace(
        '"model.attention" = ["softmax", "relu"]', '"task.seq_len" = [2]')),
        "task.seq_len=2 is not allowed"),
    "spec grid not a table": Case("value of the wrong type", spec_file("grid = 5\n"),
                                  "grid (line 1) must be a table of section.field = [values]"),
    "spec non-finite": Case("non-finite value", spec_file(TINY_SPEC.replace(
        '"model.attention" = ["softmax", "relu"]', '"train.lr" = [inf]')),
        "train.lr=inf is not allowed"),
    # sizes
    "layers": Case("size too large", train("model.n_layers=1000000000"),
                   "a run (softmax 1000000000x1, seq_len 16, d_model 16, batch 128, 1000 test "
                   "sequences) needs about"),
    "seq_len": Case("size too large", train("task.seq_len=100000"), "more than the limit of"),
    "test set": Case("size too large", train("eval.n_sequences=1000000000"),
                     "1000000000 test sequences) needs about"),
    "train seeds": Case("size too large", train("--seeds", "1000000000"),
                        "--seeds 1000000000 declares 1,000,000,000 runs"),
    "spec seeds": Case("size too large", spec_file("seeds = 1000000000\n" + TINY_SPEC),
                       "seeds=1000000000 declares 1,000,000,000 runs"),
    "spec grid": Case("size too large", spec_file(HUGE_GRID),
                      "the grid declares 25,600,000,000 runs"),
    "reproduce seeds": Case("size too large", lambda tmp: [
        "reproduce", "--seeds", "1000000000", "--out", str(tmp / "o")],
        "--seeds 1000000000 declares 6,000,000,000 runs"),
    "zoo seeds": Case("size too large", lambda tmp: [
        "zoo", "--seeds", "1000000000", "--out", str(tmp / "o")], "declares"),
    "theory sizes": Case("size too large", lambda tmp: [
        "theory", "--seq-len", "100000", "--d-model", "100000", "--out", str(tmp / "o")],
        "checking the constructions at --seq-len 100000 and --d-model 100000 needs about"),
    "memory limit": Case("size too large", train("train.max_steps=2"),
                         "more than the limit of 1 MiB (SINKLAB_MAX_MEMORY)",
                         env={"SINKLAB_MAX_MEMORY": "1M"}),
    "cell setting digits": Case("bad setting", spec_file(TINY_SPEC),
                                "SINKLAB_MAX_CELLS='²' is not allowed",
                                env={"SINKLAB_MAX_CELLS": "²"}),
    "memory setting": Case("bad setting", train("train.max_steps=2"),
                           "SINKLAB_MAX_MEMORY='lots' is not allowed",
                           env={"SINKLAB_MAX_MEMORY": "lots"}),
    "cell setting": Case("bad setting", spec_file(TINY_SPEC),
                         "SINKLAB_MAX_CELLS='-3' is not allowed", env={"SINKLAB_MAX_CELLS": "-3"}),
    "workers": Case("size too large", lambda tmp: [
        "sweep", str(write(tmp, "s.toml", TINY_SPEC)), "--out", str(tmp / "o"),
        "--workers", "2"], "--workers 2 needs about", env={"SINKLAB_MAX_MEMORY": "500M"}),
    # folders
    "foreign folder": Case("folder that is not sinklab's", lambda tmp: [
        "train", "--out", str(write(tmp, "hf/config.json", '{"model_type": "llama"}').parent)],
        "hf exists and is not an empty folder or a sinklab run folder"),
    "finished run": Case("finished run given as --out", finished_run,
                         "done already holds a finished run"),
    "other kind": Case("sinklab folder of another kind", lambda tmp: [
        "train", "--out", str(marked(tmp, "sw", "sweep"))], "is a sinklab sweep folder, not a "
                                                            "run folder"),
    "marker of another format": Case("marker that is not sinklab's", lambda tmp: [
        "zoo", "--out", str(marked(tmp, "z", "zoo", format=99))], "has format 99; this sinklab "
                                                                  "reads format 1"),
    "malformed completion record": Case("corrupted file", lambda tmp: [
        "train", "--out", str(marked(tmp, "r", "run", complete=5))],
        "has a malformed completion record"),
    "theory reproduce file": Case("file given as a folder", lambda tmp: [
        "theory", "--reproduce", str(write(tmp, "f.txt", "x")), "--out", str(tmp / "o")],
        "--reproduce {tmp}/f.txt is a file, not a reproduce folder"),
    "lm home of nobody": Case("missing file", lambda tmp: [
        "lm", "--model", "~no-such-user-here/x", "--out", str(tmp / "o")],
        "there is no such home folder"),
    "marker without kind": Case("marker that is not sinklab's", lambda tmp: [
        "reproduce", "--out", str(marked(tmp, "m", None))], "is not sinklab's marker (it names "
                                                            "no kind)"),
    "sweep into reproduce": Case("sinklab folder of another kind", lambda tmp: [
        "sweep", str(write(tmp, "s.toml", TINY_SPEC)), "--out", str(marked(tmp, "r",
                                                                          "reproduce"))],
        "is a sinklab reproduce folder, not a sweep folder"),
    "report into foreign": Case("folder that is not sinklab's", lambda tmp: [
        "report", str(marked(tmp, "res/r", "reproduce").parent), "--out",
        str(write(tmp, "mine/REPORT.md", "my notes").parent)],
        "mine exists and is not an empty folder or a sinklab report folder"),
    "report out is a file": Case("file given as a folder", lambda tmp: [
        "report", str(tmp), "--out", str(write(tmp, "notes.txt", "x"))],
        "notes.txt is a file, not a folder"),
    "report of nothing": Case("folder without results", lambda tmp: [
        "report", str(write(tmp, "empty/x.txt", "x").parent)], "holds no sinklab results"),
    "results csv folder": Case("folder given as a file", lambda tmp: [
        "results", str(tiny_sweep(tmp)), "--csv", str(tmp)], "is a folder; give the name of a "
                                                             "new file"),
    "results csv over a database": Case("file that is not sinklab's to write", lambda tmp: [
        "results", str(tiny_sweep(tmp)), "--csv", str(tmp / "sw" / "sweep.db")],
        "sweep.db exists and is not a CSV that `sinklab results` wrote"),
    "results csv over a file": Case("file that is not sinklab's to write", lambda tmp: [
        "results", str(tiny_sweep(tmp)), "--csv", str(write(tmp, "notes.csv", "a,b\n"))],
        "notes.csv exists and is not a CSV that `sinklab results` wrote"),
    "results csv into the sweep": Case("file that is not sinklab's to write", lambda tmp: [
        "results", str(tiny_sweep(tmp)), "--csv", str(tmp / "sw" / "cells.csv")],
        "is inside the sinklab folder"),
    "results csv on a pipe": Case("file that is not sinklab's to write", lambda tmp: [
        "results", str(tiny_sweep(tmp)), "--csv", str(fifo(tmp))], "pipe is not a regular file"),
    "docs into a folder of mine": Case("folder that is not sinklab's", lambda tmp: [
        "reproduce", "--quick", "--out", str(tmp / "o"), "--docs", str(
            write(tmp, "mine/notes.txt", "x").parent.with_suffix(".md"))],
        "mine holds files that are not figures (notes.txt)"),
    "docs over a file of mine": Case("file that is not sinklab's to write", lambda tmp: [
        "zoo", "--quick", "--out", str(tmp / "o"), "--docs", str(write(tmp, "README.md",
                                                                       "# My project\n"))],
        "README.md exists and is not a copy of this report"),
    "docs not markdown": Case("file that is not sinklab's to write", lambda tmp: [
        "theory", "--quick", "--out", str(tmp / "o"), "--docs", str(tmp / "theory.txt")],
        "--docs {tmp}/theory.txt is not allowed: give a Markdown file name ending in .md"),
    "results of a run": Case("folder that is not sinklab's", lambda tmp: [
        "results", str(tmp)], "is not a sweep folder"),
    "theory reproduce": Case("sinklab folder of another kind", lambda tmp: [
        "theory", "--reproduce", str(marked(tmp, "run", "run")), "--out", str(tmp / "o")],
        "is not a sinklab reproduce folder"),
    "lm model": Case("missing file", lambda tmp: [
        "lm", "--model", str(tmp / "nowhere"), "--out", str(tmp / "o")],
        "nowhere does not exist"),
    "plot missing": Case("missing file", lambda tmp: ["plot", str(tmp / "nowhere")],
                         "nowhere does not exist; give a run folder written by `sinklab train`"),
    "plot a file": Case("file given as a folder", lambda tmp: [
        "plot", str(write(tmp, "f.txt", "x"))], "f.txt is a file, not a folder"),
    "plot foreign": Case("folder that is not sinklab's", lambda tmp: [
        "plot", str(write(tmp, "hf/config.json", "{}").parent)],
        "hf is not a sinklab run folder (it has no sinklab.json)"),
    "plot other kind": Case("sinklab folder of another kind", lambda tmp: [
        "plot", str(marked(tmp, "sw", "sweep"))], "sw is a sinklab sweep folder, not a run "
                                                 "folder or a folder of seed runs"),
    "plot unfinished": Case("unfinished run", lambda tmp: ["plot", str(marked(tmp, "r", "run"))],
                            "r holds a run that has not finished"),
    "plot unfinished seed": Case("unfinished run", seeds_with_an_unfinished_run,
                                 "seeds/seed0 holds a run that has not finished"),
    "plot damaged": Case("corrupted file", damaged_run, "done/model.pt is 4 bytes, not the"),
    "out is a file": Case("file given as a folder", lambda tmp: [
        "train", "--out", str(write(tmp, "f.txt", "x"))], "f.txt is a file, not a folder"),
    # the file system
    "read-only": Case("file system refuses", read_only, "ro/o: Permission denied"),
    "under a file": Case("file system refuses", lambda tmp: [
        "train", "--out", str(write(tmp, "f.txt", "x") / "o")], "f.txt/o: Not a directory"),
    "name too long": Case("file system refuses", lambda tmp: [
        "train", "--out", str(tmp / ("n" * 300))], "File name too long"),
    "full disk": Case("file system refuses", full_disk,
                      "o/metrics.jsonl: No space left on device (free some space", changes=("o",)),
}
KINDS = sorted({case.kind for case in CASES.values()})


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every path under ``root`` with its type and content hash (link targets for links)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", "")
        elif not path.is_file():  # a pipe: never read it
            found[rel] = ("special", "")
        else:
            found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def outside(paths: dict[str, tuple[str, str]], allowed: tuple[str, ...]) -> dict:
    return {k: v for k, v in paths.items()
            if not any(k == a or k.startswith(a + os.sep) for a in allowed)}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_sentence_and_changes_nothing(name, tmp_path, capsys, monkeypatch):
    case = CASES[name]
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    if name == "read-only" and os.geteuid() == 0:  # root writes anywhere: refuse it ourselves
        real_mkdir = os.mkdir

        def refusing_mkdir(path, *args, **kwargs):
            if str(path).startswith(str(tmp_path / "ro") + os.sep):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", refusing_mkdir)
    if name == "full disk" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    argv = case.argv(tmp_path)
    capsys.readouterr()
    before = snapshot(tmp_path)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code != 0, (argv, out, err)
    assert err.startswith("sinklab: error: ") and err.count("\n") == 1, err
    assert case.says.format(tmp=tmp_path) in err, err
    assert "Traceback" not in err and "Traceback" not in out
    assert outside(snapshot(tmp_path), case.changes) == outside(before, case.changes)


def test_the_battery_covers_every_kind():
    # what the closing note reports; a kind with no row would be a gap in the table
    assert len(KINDS) >= 20 and all(any(c.kind == k for c in CASES.values()) for k in KINDS)


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    from sinklab import cli

    def broken(args):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(cli, "cmd_rules", lambda: broken(None))
    assert main(["rules"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err == ("sinklab: error: internal error (RuntimeError: a bug); run again with --debug "
                   "for the traceback, and please report it.\n")
    assert main(["--debug", "rules"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("report it.\n")
    monkeypatch.setenv("SINKLAB_DEBUG", "1")
    assert main(["rules"]) == cli.EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err
