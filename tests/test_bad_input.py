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


def rule_file(tmp: Path, name: str, row_kind: str, body: str) -> Path:
    """A plugin file registering the attention rule ``name``, ``def rule(scores, mask):`` with
    the one line ``body``."""
    return write(tmp, "rules.py", "from sinklab.attention import register\n"
                 f"@register({name!r}, row_kind={row_kind!r})\n"
                 f"def rule(scores, mask):\n    {body}\n")


def tiny_model(tmp: Path, kind: str, tokenizer: bool = True, cut: bool = False) -> Path:
    """A tiny random Hugging Face model folder (``tests/helpers.py``), without its tokenizer
    files or with its weights cut short on request."""
    import helpers

    folder = helpers.hf_folder(kind, tmp / kind)
    if not tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    if cut:
        weights = folder / "model.safetensors"
        with weights.open("r+b") as f:  # the header stays whole, the tensors' data does not
            f.truncate(weights.stat().st_size - 1000)
    return folder


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
        "--out", str(tmp / "o")], "model.attention_args.bias = 'low' is a string; write a "
                                  "number without quotes"),
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
    # issue 23: plugins checked where they are used, rule arguments against their dtype
    "plugin rule of the wrong shape": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(rule_file(tmp, "p23_shape", "free",
                                           "return (scores.relu() * mask)[..., 0]")),
        "model.attention=p23_shape", "--out", str(tmp / "o")],
        "attention rule 'p23_shape' (from plugin {tmp}/rules.py) returned weights of shape "
        "(4, 10) on finite scores of shape (4, 10, 5) and a causal mask of shape (10, 5), not of "
        "the scores' shape (4, 10, 5)."),
    "plugin rule that raises": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(rule_file(tmp, "p23_raises", "free", "raise RuntimeError("
                                           "'no kernel for this shape\\nsecond line')")),
        "model.attention=p23_raises", "--out", str(tmp / "o")],
        "attention rule 'p23_raises' (from plugin {tmp}/rules.py) raised RuntimeError: no kernel "
        "for this shape when called on finite scores of shape (4, 10, 5)"),
    "plugin rule that returns None": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(rule_file(tmp, "p23_none", "free", "scores.relu() * mask")),
        "model.attention=p23_none", "--out", str(tmp / "o")],
        "attention rule 'p23_none' (from plugin {tmp}/rules.py) returned None on finite scores "
        "of shape (4, 10, 5) and a causal mask of shape (10, 5), not a tensor of weights of "
        "shape (4, 10, 5)."),
    "plugin rule that gives NaN": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(rule_file(tmp, "p23_nan", "free", "return scores.log() * mask")),
        "model.attention=p23_nan", "--out", str(tmp / "o")],
        "attention rule 'p23_nan' (from plugin {tmp}/rules.py) returned "),
    "plugin rule that sees the future": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(rule_file(tmp, "p23_future", "simplex",
                                           "return scores.softmax(-1)")),
        "model.attention=p23_future", "--out", str(tmp / "o")],
        "attention rule 'p23_future' (from plugin {tmp}/rules.py) put weight on masked "
        "keys on finite scores of shape (4, 10, 5) and a causal mask of shape (10, 5): the "
        "largest |weight| at a masked key is "),
    "plugin rule's parameter not finite": Case("plugin rule that breaks the contract", lambda tmp: [
        "train", "--plugin", str(write(tmp, "rules.py", (
            "import torch\n"
            "from sinklab.attention import Arg, ParamRule, register, softmax\n"
            "@register('p23_param', row_kind='simplex', kwargs={'log_scale': Arg('its log')})\n"
            "class Rule(ParamRule):\n"
            "    '''Softmax of the scores times a learned scale.'''\n"
            "    def __init__(self, n_members, n_heads, d_model, *, log_scale: float = 0.0):\n"
            "        super().__init__(n_members, n_heads, d_model)\n"
            "        start = torch.full((n_members, n_heads), log_scale).exp()\n"
            "        self.scale = torch.nn.Parameter(start)\n"
            "    def forward(self, scores, mask, x=None):\n"
            "        return softmax(scores * self.scale.mean(), mask)\n"))),
        "model.attention=p23_param", "model.attention_args.log_scale=100", "--out",
        str(tmp / "o")],
        "attention rule 'p23_param' (from plugin {tmp}/rules.py) with log_scale=100.0 has a "
        "parameter 'scale' that is not finite (inf) when built with n_members=2, n_heads=2, "
        "d_model=4: every parameter must be finite."),
    "plugin rule in a sweep": Case("plugin rule that breaks the contract", lambda tmp: [
        "sweep", str(write(tmp, "s.toml", TINY_SPEC.replace('"relu"', '"p23_sweep"'))),
        "--out", str(tmp / "o"), "--plugin",
        str(rule_file(tmp, "p23_sweep", "free", "return scores.relu()"))],
        "{tmp}/s.toml: cell model.attention=p23_sweep,seed=0: attention rule 'p23_sweep' (from "
        "plugin {tmp}/rules.py) put weight on masked keys"),
    "plugin rule in a study": Case("plugin rule that breaks the contract", lambda tmp: [
        "zoo", "--quick", "--rules", "p23_zoo", "--out", str(tmp / "o"), "--plugin",
        str(rule_file(tmp, "p23_zoo", "free", "return (scores.relu() * mask).double()"))],
        "attention rule 'p23_zoo' (from plugin {tmp}/rules.py) returned float64 weights on "
        "finite scores of shape (4, 10, 5)"),
    "rule argument beyond float32": Case("value the model's float32 cannot hold", train(
        "model.attention=sink_logit", "model.attention_args.init=1e308"),
        "model.attention_args.init=1e+308 is not allowed: sink_logit's init must be a finite "
        "number with |x| <= 3.4028e38, the range of the float32 the model computes in"),
    # issue 23: certificates only where they hold, Ray bounded
    "worst on a diverged run": Case("run that diverged or blew up", lambda tmp: [
        "worst", str(tmp / "div")] if main([  # lr 1e12: the loss is inf after one step
            "train", "train.lr=1e12", "train.max_steps=50", "eval.n_sequences=8",
            "task.seq_len=6", "task.d_model=6", "task.eval_trigger=5", "--out",
            str(tmp / "div")]) == 1 else ["the run did not diverge"],
        "{tmp}/div holds a run that diverged (its loss was not finite at step 1)"),
    "worst beyond the certificate's range": Case("run that diverged or blew up", lambda tmp: [
        "worst", str(tmp / "big")] if main([  # lr 1e3: finite, but weights of 1e4 and more
            "train", "train.lr=1e3", "train.max_steps=30", "eval.n_sequences=8",
            "task.seq_len=6", "task.d_model=6", "task.eval_trigger=5", "--out",
            str(tmp / "big")]) == 0 else ["the run diverged"],
        "{tmp}/big is outside the certificate's range: its attention scores can reach"),
    # issue 23: folders (--docs, --reuse, markers, stores, reports) and sweep specs
    "docs inside a run folder": Case("--docs inside a sinklab folder", lambda tmp: [
        "zoo", "--quick", "--out", str(tmp / "o"), "--docs",
        str(marked(tmp, "run", "run") / "notes.md")],
        "--docs {tmp}/run/notes.md is inside the sinklab folder {tmp}/run, whose files are "
        "sinklab's own; give a file outside it."),
    "docs inside --out": Case("--docs inside a sinklab folder", lambda tmp: [
        "zoo", "--quick", "--out", str(tmp / "o"), "--docs", str(tmp / "o" / "zoo.md")],
        "--docs {tmp}/o/zoo.md is inside the --out folder {tmp}/o, whose files are the study's "
        "own; give a file outside it."),
    "docs over a file with the report's title": Case("file that is not sinklab's to write",
        lambda tmp: ["zoo", "--quick", "--out", str(tmp / "o"), "--docs", str(write(
            tmp, "zoo.md", "# Zoo: which attention rules need a sink\n\nmy notes\n"))],
        "--docs {tmp}/zoo.md exists and is not a copy of this report that sinklab wrote (it has "
        "neither sinklab's mark nor this study's records beside it); choose another file."),
    "docs over another study's copy": Case("file that is not sinklab's to write", lambda tmp: [
        "zoo", "--quick", "--out", str(tmp / "o"), "--docs", str(write(
            tmp, "t.md", "# Theory\n\n<!-- written by sinklab theory: records in t.json -->\n"))],
        "--docs {tmp}/t.md is sinklab's copy of the report of sinklab theory, not of sinklab "
        "zoo; choose another file."),
    "reuse a folder of mine": Case("folder that is not sinklab's", lambda tmp: [
        "extensions", "--quick", "--reuse", str(write(tmp, "mine/runs/x.txt", "x").parent.parent),
        "--out", str(tmp / "o")],
        "--reuse {tmp}/mine is not a sinklab folder (it has no sinklab.json), so it holds no "
        "finished runs to adopt"),
    "reuse a sweep folder": Case("sinklab folder of another kind", lambda tmp: [
        "extensions", "--quick", "--reuse", str(marked(tmp, "sw", "sweep")), "--out",
        str(tmp / "o")], "--reuse {tmp}/sw is a sinklab sweep folder, not a study's folder"),
    "study marker corrupted, nothing to rebuild from": Case("corrupted marker", lambda tmp: [
        "zoo", "--quick", "--out", str(write(tmp, "z/sinklab.json", "{torn").parent)],
        "{tmp}/z/sinklab.json is corrupted (not valid JSON: Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)), and {tmp}/z holds nothing of sinklab zoo to "
        "rebuild it from"),
    "study marker corrupted beside a file of mine": Case("corrupted marker", lambda tmp: [
        "zoo", "--quick", "--out", str((write(tmp, "z/sinklab.json", "{torn"),
                                        write(tmp, "z/notes.txt", "mine"))[0].parent)],
        "{tmp}/z also holds notes.txt, which sinklab zoo does not write, so it is not rebuilt: "
        "move that out of {tmp}/z and run this command again, or choose another --out."),
    "study marker corrupted in another study's folder": Case("corrupted marker", lambda tmp: [
        "zoo", "--quick", "--out", str((write(tmp, "z/sinklab.json", "{torn"), write(
            tmp, "z/records.json", '{"meta": {"study": "theory"}}'))[0].parent)],
        "its records.json says `sinklab theory` wrote {tmp}/z, not sinklab zoo: run `sinklab "
        "theory` with --out {tmp}/z to rebuild it."),
    "run marker corrupted": Case("corrupted marker", lambda tmp: [
        "train", "--out", str((write(tmp, "r/sinklab.json", "{torn"),
                               write(tmp, "r/config.json", "{}"))[0].parent)],
        "sinklab cannot tell what {tmp}/r holds; delete {tmp}/r to train that run again"),
    "sweep marker corrupted": Case("corrupted marker", lambda tmp: [
        "sweep", str(tmp / "s.toml"), "--out", str(write(tiny_sweep(tmp), "sinklab.json",
                                                         "{torn").parent)],
        "delete {tmp}/sw/sinklab.json and run the sweep again with --out {tmp}/sw: it marks the "
        "folder again from its sweep.db."),
    "sweep store junk": Case("corrupted file", lambda tmp: [
        "sweep", str(tmp / "s.toml"), "--out", str(write(tiny_sweep(tmp), "sweep.db",
                                                         b"junk" * 500).parent)],
        "{tmp}/sw/sweep.db is corrupted or not a sinklab database (file is not a database); it "
        "was the record of this sweep's cells, so the sweep cannot resume from it: run the same "
        "`sinklab sweep` command with a new --out"),
    "study store junk listed": Case("corrupted file", lambda tmp: [
        "results", str(write(marked(tmp, "z", "zoo"), "sweep.db", b"junk" * 500).parent)],
        "it only indexes the runs of this zoo folder, whose run folders hold the results: run "
        "the same `sinklab zoo` command again (the same options, --out {tmp}/z), which moves it "
        "aside"),
    "report not UTF-8": Case("file not UTF-8", lambda tmp: [
        "report", str(write(marked(tmp, "res/r", "reproduce"), "REPORT.md",
                            b"# r\n\xff\n").parent.parent), "--out", str(tmp / "rep")],
        "{tmp}/res/r/REPORT.md is not UTF-8 text (byte 4 cannot be decoded), so it is not the "
        "report sinklab reproduce wrote; run `sinklab reproduce` with --out {tmp}/res/r again"),
    "spec key in base and grid": Case("value given twice", spec_file(
        '[base]\ntrain.lr = 0.01\n[grid]\n"train.lr" = [0.001, 0.002]\n'),
        "spec.toml: grid key 'train.lr' (line 4) is also set in [base] (line 2): a key is either "
        "fixed in [base] or varied in [grid], not both"),
    "option flag named as given": Case("value of the wrong type", lambda tmp: [
        "lm", "--tokens", "10^9", "--out", str(tmp / "o")],
        "--tokens='10^9' is not allowed: it must be an integer."),
    "option override named as given": Case("value of the wrong type", lambda tmp: [
        "lm", "lm.n_tokens=10^9", "--out", str(tmp / "o")],
        "lm.n_tokens='10^9' is not allowed: it must be an integer."),
    "option in a file named as given": Case("value out of range", lambda tmp: [
        "lm", "--config", str(write(tmp, "x.toml", "[lm]\nn_tokens = -5\n")), "--out",
        str(tmp / "o")],
        "config file '{tmp}/x.toml': [lm] n_tokens=-5 is not allowed: it must be an integer >="),
    # issue 23: sinklab lm, decided before the work
    "lm tokens past the positions": Case("value out of range", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "llama")), "--tokens", "300", "--out",
        str(tmp / "o")], "--tokens=300 is more than --model {tmp}/llama takes: it has 256 "
                         "positions (max_position_embeddings), less <s>, so a probe holds at "
                         "most 255 tokens; give 255 or fewer."),
    "lm tokens past an encoder's positions": Case("value out of range", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "bert")), "--tokens", "255", "--out",
        str(tmp / "o")], "256 positions (max_position_embeddings), less [CLS] and [SEP], so a "
                         "probe holds at most 254 tokens"),
    "lm tokens absurd": Case("size too large", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "llama")), "--tokens", "1000000000", "--out",
        str(tmp / "o")], "--tokens=1000000000 is not allowed: no model sinklab loads takes more "
                         "than 1,000,000 positions"),
    "lm memory before loading": Case("size too large", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "llama")), "--out", str(tmp / "o")],
        "of float32 weights) with --tokens 64, --random 100, --batch-size 16 and --intervene 16 "
        "needs about", env={"SINKLAB_MAX_MEMORY": "1M"}),
    "lm second model unknown": Case("model that cannot be loaded", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "llama")), "--model",
        str(write(tmp, "mine/config.json", '{"model_type": "sinkformer"}').parent),
        "--out", str(tmp / "o")], "--model {tmp}/mine: {tmp}/mine/config.json names the model "
                                  "type 'sinkformer', which transformers"),
    "lm model without a tokenizer": Case("model that cannot be loaded", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "gpt2", tokenizer=False)), "--out",
        str(tmp / "o")], "--model {tmp}/gpt2: {tmp}/gpt2 has no tokenizer files"),
    "lm truncated weights": Case("corrupted file", lambda tmp: [
        "lm", "--model", str(tiny_model(tmp, "llama", cut=True)), "--out", str(tmp / "o")],
        "bytes, shorter than the"),
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

    monkeypatch.setitem(cli.COMMANDS, "rules",
                        cli.Command(cli.COMMANDS["rules"].add, lambda args, argv: broken(args)))
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
