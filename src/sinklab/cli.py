"""The ``sinklab`` command line: argument parsing only; each subcommand calls the library.

    sinklab train model.attention=relu model.n_layers=2 model.n_heads=2 --out runs/relu-2x2
    sinklab plot runs/relu-2x2
    sinklab reproduce --out results/reproduce
    sinklab sweep examples/tiny.toml --out results/sweep-tiny
    sinklab rules
    sinklab train --plugin examples/plugins/softmax_t.py model.attention=softmax_t \
        model.attention_args.t=2 --out runs/t2

``--plugin MODULE`` (any subcommand, repeatable), ``SINKLAB_PLUGINS`` and the installed entry
points of the group ``sinklab.rules`` load attention rules of one's own before the command runs
(``sinklab.plugins``).

``main(argv)`` returns the exit status, so tests call it in-process. Every error that reaches
it is one sentence on stderr (``sinklab: error: ...``): bad input, a file system error or a
refused folder return 2, a diverged training run or failed sweep cell 1, an interrupt 130 (Ctrl-C
or SIGTERM, which ``main`` turns into the same KeyboardInterrupt), and an
error inside sinklab itself 3. ``--debug`` (or ``SINKLAB_DEBUG=1``) also prints the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import shlex
import signal
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from sinklab import __version__, heavy, studies
from sinklab import formats as md
from sinklab.claims import Claim
from sinklab.config import SECTIONS, check_count, config_from_cli
from sinklab.errors import Interrupted, ResultsError, SinklabError
from sinklab.pretrain import birth
from sinklab.runs import folders, limits
from sinklab.studies.options import build_options, option_fields
from sinklab.studies.study import Execution

EXIT_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_INTERNAL = 2, 1, 130, 3
DEBUG_ENV = "SINKLAB_DEBUG"


def given(text: str) -> str:
    """A path or address option's value: anything but an empty string (which would mean the
    current folder, or nothing, without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value is not allowed")
    return text


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one sentence (argparse prints the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"sinklab: error: {message} (see `{self.prog} --help`).\n")


LIMITS_TEXT = """\
Every writer of a folder locks it (a second one is refused, naming the first one's process), and
writes only into a folder that is absent, empty or sinklab's own of the same kind. Sizes are
checked before anything is allocated: SINKLAB_MAX_MEMORY (default: half this machine's memory,
e.g. SINKLAB_MAX_MEMORY=64G) and SINKLAB_MAX_CELLS (default 100000 runs per sweep or experiment)
raise the limits. --executor ray: a local Ray instance's object store is a quarter of
SINKLAB_MAX_MEMORY (at most 2 GiB), and Ray gets SINKLAB_RAY_START_S seconds (default 120) to
start or connect.
Exit status: 0 done, 1 a run diverged or a sweep cell failed, 2 bad input or a refused folder,
3 an error inside sinklab, 130 interrupted (Ctrl-C or SIGTERM)."""


PLUGIN_HELP = ("load attention rules of your own from MODULE first: a .py file or an importable "
               "module name (repeatable; also SINKLAB_PLUGINS=A,B and the entry points of the "
               "group sinklab.rules)")


def _defaults_text() -> str:
    lines = ["override keys (section.field=value) and their defaults:"]
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name == "attention_args":
                lines.append(f"  {section}.{f.name}.NAME=VALUE  (the rule's keyword "
                             "arguments: `sinklab rules`)")
                continue
            shown = "seq_len - 1" if f.name == "train_trigger_max" else f.default
            lines.append(f"  {section}.{f.name}={'auto' if shown is None else shown}")
    lines += ["", "auto: train.lr is 1e-3 for 1 layer x 1 head and 1e-4 otherwise (the paper's);",
              "task.target is plain for 1 layer and residual for deeper stacks.",
              "Precedence: defaults < --config FILE (TOML tables [task] [model] [train] [eval],",
              "[model.attention_args]) < key=value overrides."]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sinklab",
        description="Study attention sinks: train models on the trigger-conditional task, "
                    "measure and draw their sinks, reproduce Ran-Milo (2026), compare attention "
                    "rules, measure real pretrained models, and run resumable sweeps.",
        epilog=LIMITS_TEXT, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sinklab {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an error (also {DEBUG_ENV}=1)")
    parser.add_argument("--plugin", dest="plugins_first", action="append", default=[],
                        type=given, metavar="MODULE", help=PLUGIN_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=f"show the traceback of an error (also {DEBUG_ENV}=1)")
    common.add_argument("--plugin", dest="plugins", action="append", default=[], type=given,
                        metavar="MODULE", help=PLUGIN_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for study in studies.all_studies():
        if study.name in COMMANDS:
            raise ValueError(f"a study or command named {study.name!r} exists already")
        _add_study(sub, common, study)
    for command in COMMANDS.values():
        command.add(sub, common)
    return parser


def _add_train(sub: Any, common: argparse.ArgumentParser) -> None:
    train = sub.add_parser(
        "train", parents=[common],
        help="train one model (or --seeds N of them) and write run folders",
        description="Train with the paper's protocol and write into --out: sinklab.json (the "
                    "folder's marker) and config.json at the start, metrics.jsonl as it trains, "
                    "attention.npz, model.pt and summary.json when it stops, and last the "
                    "completion record of every file in sinklab.json. No figure is drawn: "
                    "`sinklab plot DIR` draws attention.png afterwards. --out must be absent, "
                    "empty or an unfinished run folder of sinklab's.",
        epilog=_defaults_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="config overrides such as model.attention=relu")
    train.add_argument("--config", type=given, metavar="FILE", help="a TOML config file")
    train.add_argument("--out", type=given, default="runs/train", metavar="DIR",
                       help="run folder to write (default: runs/train)")
    train.add_argument("--seeds", type=int, default=1, metavar="N",
                       help="train N seeds (train.seed, train.seed+1, ...) as one batched "
                            "ensemble, each into DIR/seed{s} (default: 1, into DIR)")
    train.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="show a progress bar (default: only on a terminal)")


def _add_plot(sub: Any, common: argparse.ArgumentParser) -> None:
    pl = sub.add_parser(
        "plot", parents=[common],
        help="draw finished runs' attention maps (attention.png in each run folder)",
        description="Draw each finished run's attention maps (the mean over the test set of every "
                    "layer and head, and for 1x1 its standard deviation) from its attention.npz "
                    "into attention.png beside it. RUN is a `sinklab train` --out folder, or a "
                    "`sinklab train --seeds N` folder (every seed run in it). The figure is not "
                    "part of the run's completion record, so drawing it again leaves the run "
                    "finished. Every RUN is checked before anything is drawn.")
    pl.add_argument("runs", nargs="+", type=given, metavar="RUN",
                    help="a finished run folder, or a folder of seed runs")


def _add_sweep(sub: Any, common: argparse.ArgumentParser) -> None:
    sw = sub.add_parser(
        "sweep", parents=[common],
        help="run a declared grid of runs (TOML spec), resumably, locally or on Ray",
        description="Expand a sweep spec (a base config, a grid of section.field values and "
                    "seeds; see examples/) into cells and train them, batched into ensembles. "
                    "Results go to DIR/sweep.db (SQLite), DIR/runs/ and DIR/results.csv. "
                    "Rerunning the same command resumes: finished cells are kept, unfinished "
                    "ones run again. Exit status 1 when a cell failed.")
    sw.add_argument("spec", type=given, metavar="SPEC", help="the sweep spec, a TOML file")
    sw.add_argument("--out", type=given, required=True, metavar="DIR", help="the sweep folder")
    _add_executor_options(sw)
    sw.add_argument("--workers", type=int, default=None, metavar="N",
                    help="parallel workers (default: one per CPU core)")
    sw.add_argument("--retry-failed", action="store_true",
                    help="run the cells that failed before again")


def _add_results(sub: Any, common: argparse.ArgumentParser) -> None:
    rs = sub.add_parser(
        "results", parents=[common],
        help="list and filter the cells of a sweep folder",
        description="Print the cells of a sweep folder (sweep.db) with their status and summary "
                    "metrics, optionally filtered, or write them as CSV; with --by KEY, one row "
                    "per value of a grid key instead.")
    rs.add_argument("dir", type=given, metavar="DIR", help="a sweep folder")
    rs.add_argument("--status", default=None, help="only cells with this status: pending, "
                    "running, done or failed")
    rs.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="only cells whose grid value (e.g. model.attention=relu) or seed "
                         "matches; repeat to combine")
    rs.add_argument("--by", type=given, default=None, metavar="KEY",
                    help="one row per value of a grid key (e.g. model.attention) or seed: its "
                         "cells done, failed and pending and each metric's median [lowest, "
                         "highest]; combines with --where, --status and --csv")
    rs.add_argument("--csv", type=given, default=None, metavar="FILE",
                    help="write the cells (with --by, the groups) as CSV instead (a new file, "
                         "or one this command wrote)")


def _add_report(sub: Any, common: argparse.ArgumentParser) -> None:
    rp = sub.add_parser(
        "report", parents=[common],
        help="gather every result under a folder into one HTML page and REPORT.md",
        description="Find the study folders (reproduce, theory, zoo, extensions, lm, pretrain) "
                    "and sweep folders in DIR (and up to two levels below) and gather their "
                    "reports, with the commands and versions "
                    "behind every number, into one self-contained HTML page (figures embedded, "
                    "a table of contents, no JavaScript) and REPORT.md.")
    rp.add_argument("dir", type=given, metavar="DIR", help="a folder holding sinklab results")
    rp.add_argument("--out", type=given, default=None, metavar="FOLDER",
                    help="where to write REPORT.html and REPORT.md (default: DIR/report)")


def _add_worst(sub: Any, common: argparse.ArgumentParser) -> None:
    wp = sub.add_parser(
        "worst", parents=[common],
        help="the worst-case error of finished runs over every input",
        description="For each finished run folder: the largest error per row type (BOS, "
                    "non-trigger rows before and after the trigger, the trigger row) on sampled "
                    "test sequences, the attack's lower bound on the supremum over every input "
                    "(sinklab.theory.attack), and for 1-layer, 1-head softmax and ReLU models the "
                    "certified upper bound at every row, trigger rows included "
                    "(sinklab.theory.certify, sinklab.theory.trigger), with ReLU's largest "
                    "non-trigger score (<= 0: those rows are zero for every input) and softmax's "
                    "certified BOS mass: lower bounds over every input and at the theorem's input "
                    "X*, the norm of W_Q W_K^T they force, and the smallest mass an attack finds "
                    "(sinklab.theory.sink).")
    wp.add_argument("runs", nargs="+", type=given, metavar="RUN", help="a finished run folder")
    wp.add_argument("--attack-steps", type=int, default=100, metavar="N",
                    help="projected-gradient steps of the attack (default: 100)")
    wp.add_argument("--restarts", type=int, default=8, metavar="N",
                    help="random starts per trigger position and row (default: 8)")
    wp.add_argument("--certify-seconds", type=float, default=30.0, metavar="S",
                    help="time cap of one model's certificate: its non-trigger rows share it, "
                         "and its trigger rows share as much again (default: 30; the gap left "
                         "is printed)")


def _add_rules(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser("rules", parents=[common], help="list the attention rules",
                   description="List the registered attention rules: what a row of weights can "
                               "sum to, whether the rule learns parameters, the plugin it comes "
                               "from (for a rule of your own, loaded with --plugin MODULE), its "
                               "description and its keyword arguments "
                               "(model.attention_args.NAME=VALUE) with their types and defaults.")


def _add_render(sub: Any, common: argparse.ArgumentParser) -> None:
    rd = sub.add_parser(
        "render", parents=[common],
        help="write reports in docs/ again from the records beside them",
        description="Write each FILE, a report a study copied with --docs FILE (known by the mark "
                    "on its last line or its study's heading, with its records beside it as "
                    "FILE.json), again from those records: after a "
                    "change of the study's template or of the code that decides its claims. "
                    "Nothing is trained and the figures are left as they are; the records a "
                    "study can complete cheaply (a control's untrained models) are added, the "
                    "claims are decided again and written into FILE.json too, and a line says "
                    "whether they are the ones recorded with them.")
    rd.add_argument("docs", nargs="+", type=given, metavar="FILE",
                    help="a report in docs/, e.g. docs/zoo.md")


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", default="local",
                        help="local (processes on this machine, default) or ray (extra "
                             "sinklab[ray]; see docs/sweeps.md)")
    parser.add_argument("--ray-address", type=given, default=None, metavar="ADDR",
                        help="a running Ray cluster: HOST:PORT, auto, or ray://HOST:10001 (Ray "
                             "Client, needs ray[client]); default: start a local Ray instance "
                             "for the run. A cluster with token authentication needs "
                             "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN here too (docs/sweeps.md)")


def _add_study(sub: Any, common: argparse.ArgumentParser, study: Any) -> None:
    """A study's subcommand, generated from its declaration: one flag per option (its field's
    ``metadata``: ``help``, and optionally ``flag``, ``metavar``, ``append``), ``--config``
    with a [NAME] table, ``NAME.OPTION=VALUE`` overrides, and the options every study shares."""
    parser = sub.add_parser(
        study.name, parents=[common], help=study.help,
        description=f"{study.description} Options: defaults < --config FILE ([{study.name}] "
                    f"table) < {study.name}.OPTION=VALUE < flags.")
    parser.add_argument("overrides", nargs="*", metavar=f"{study.name}.OPTION=VALUE",
                        help="option overrides, e.g. "
                             f"{study.name}.{option_fields(study.options)[0].name}=...")
    parser.add_argument("--out", type=given, default=study.default_out or f"results/{study.name}",
                        metavar="DIR", help="results folder (default: "
                        f"{study.default_out or f'results/{study.name}'})")
    parser.add_argument("--config", type=given, default=None, metavar="FILE",
                        help=f"a TOML file whose [{study.name}] table sets options")
    for f in option_fields(study.options):
        meta = f.metadata
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        dest = f"opt_{f.name}"
        text = meta.get("help", f.name)
        if f.type in (bool, "bool"):
            action = argparse.BooleanOptionalAction if f.default is True else "store_true"
            parser.add_argument(flag, dest=dest, action=action, default=None, help=text)
        elif meta.get("append"):
            parser.add_argument(flag, dest=dest, action="append", type=given, default=None,
                                metavar=meta.get("metavar", "VALUE"), help=text)
        else:
            parser.add_argument(flag, dest=dest, default=None, type=given,
                                metavar=meta.get("metavar", "VALUE"), help=text)
    if study.trains:
        parser.add_argument("--workers", type=int, default=None, metavar="N",
                            help="parallel worker processes (default: one per CPU core)")
        _add_executor_options(parser)
    parser.add_argument("--device", default="auto",
                        help="auto, cpu, cuda or cuda:N (default: auto)")
    example = f" (e.g. {study.docs_example})" if study.docs_example else ""
    parser.add_argument("--docs", type=given, default=None, metavar="FILE",
                        help=f"also write the report to FILE{example}, with its figures in a "
                             "folder of the same name")


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    train_runs = heavy("train").train_runs
    cfg = config_from_cli(args.overrides, args.config)
    check_count("--seeds", args.seeds)
    limits.check_cells(args.seeds, f"--seeds {args.seeds}")
    limits.check_run(cfg, args.seeds)
    out = Path(args.out)
    # One seed writes DIR itself; several seeds train as one ensemble into DIR/seed{s}.
    seeds = [cfg.train.seed + i for i in range(args.seeds)]
    cfgs = [dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=s))
            for s in seeds]
    dirs = [out] if len(seeds) == 1 else [out / f"seed{s}" for s in seeds]
    for d in dirs:
        folders.check_writable(d, "run")
        if folders.check_complete(d):
            raise ResultsError(f"{d} already holds a finished run; choose another --out or "
                               "delete it.")
    with folders.writing(out, "run" if len(seeds) == 1 else "runs"):
        summaries = train_runs(cfgs, dirs, progress=args.progress,
                               description=f"{cfg.model.attention} "
                                           f"{cfg.model.n_layers}x{cfg.model.n_heads}")
    code = 0
    for summary, run_dir in zip(summaries, dirs):
        name = f"{summary['attention']} {summary['n_layers']}x{summary['n_heads']}, " \
               f"seed {summary['seed']}"
        if summary["status"] == "diverged":
            print(f"sinklab: error: {name} diverged at step {summary['steps']} (the loss is not "
                  f"finite); its logs are kept in {run_dir}.", file=sys.stderr)
            code = EXIT_DIVERGED
            continue
        verb = "converged after" if summary["converged"] else \
            "stopped on a plateau at" if summary["status"] == "plateau" else \
            "stopped without converging at"
        # 3 significant digits, never an exact-looking 1 or 0 (0.99996 is "1 - 4.00e-05")
        bos = "[" + ", ".join("[" + ", ".join(md.mass_text(v) for v in layer) + "]"
                              for layer in summary["bos_mass_nontrigger"]) + "]"
        n_heads = summary["n_layers"] * summary["n_heads"]
        print(f"{name}: {verb} {summary['steps']} steps (last batch L∞ "
              f"{summary['train_linf']:.2e})")
        if summary.get("lr_drop_steps"):
            steps = ", ".join(f"{s:,}" for s in summary["lr_drop_steps"])
            print(f"  learning rate dropped at step(s) {steps}, to {summary['lr_final']:g}")
        print(f"  test set: L∞ {summary['linf_error']:.2e}, MSE {summary['mse']:.2e}")
        print(f"  non-trigger BOS mass [layer][head]: {bos}")
        print(f"  sink heads: {summary['sink_heads']} of {n_heads}")
        print(f"  wrote {run_dir}/: config.json metrics.jsonl attention.npz model.pt "
              "summary.json sinklab.json")
    if any(s["status"] != "diverged" for s in summaries):
        print(f"draw the attention maps: sinklab plot {shlex.quote(str(out))}")
    return code


def cmd_plot(args: argparse.Namespace, argv: list[str]) -> int:
    for run, figure in heavy("plots").plot_runs([Path(r) for r in args.runs]):
        if figure is None:
            print(f"sinklab: left out: {run} diverged, so it has no maps to draw.",
                  file=sys.stderr)
        else:
            print(f"wrote {figure}")
    return 0


@dataclass(frozen=True)
class Usage:
    """Seconds of wall time and of CPU time at a moment: this process's and its children's
    (worker processes count once they have ended and were waited for)."""

    wall: float
    cpu: float

    @classmethod
    def now(cls) -> Usage:
        t = os.times()
        return cls(time.perf_counter(), t.user + t.system + t.children_user + t.children_system)


def duration(seconds: float) -> str:
    """42 -> '42 s', 102 -> '1 min 42 s', 3725 -> '1 h 02 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60:02d} s"
    return f"{total // 3600} h {total % 3600 // 60:02d} min"


def took(started: Usage, result: dict[str, Any], executor: str) -> str:
    """The line a study ends with: its wall and CPU time, and the workers that trained."""
    now = Usage.now()
    meta = result.get("meta", {})
    workers = f" on {meta['workers']} worker(s)" if meta.get("runs_trained") else ""
    elsewhere = " (Ray's workers not counted)" if executor == "ray" else ""
    return (f"took {duration(now.wall - started.wall)} of wall time, "
            f"{duration(now.cpu - started.cpu)} of CPU time{elsewhere}{workers}")


def cmd_study(study: Any, args: argparse.Namespace, argv: list[str],
              started: Usage | None = None) -> int:
    """Run a study: its options from the flags, --config and overrides
    (``sinklab.studies.options``), run by ``sinklab.studies.runner``."""
    started = started or Usage.now()
    flags = {f.name: getattr(args, f"opt_{f.name}") for f in option_fields(study.options)}
    opts = build_options(study, args.config, args.overrides, flags)
    exe = Execution(workers=getattr(args, "workers", None), device=args.device,
                    executor=getattr(args, "executor", "local"),
                    ray_address=getattr(args, "ray_address", None))
    command = "sinklab " + " ".join(shlex.quote(a) for a in argv)
    result = heavy("studies.runner").run_study(
        study, Path(args.out), opts, exe, docs=Path(args.docs) if args.docs else None,
        command=command)
    claims = [Claim.from_dict(c) for c in result["claims"]]
    for line in heavy("studies.render").headline(claims):
        print(line)
    print(f"wrote {Path(args.out) / study.report}")
    for line in getattr(opts, "closing_lines", list)():  # the study's last word (pretrain --quick)
        print(line)
    print(took(started, result, exe.executor))
    return 0


def cmd_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    sweeps = heavy("sweeps.run")
    opts = sweeps.SweepOptions(executor=args.executor, workers=args.workers,
                               ray_address=args.ray_address, retry_failed=args.retry_failed)
    counts = sweeps.run_sweep(args.spec, args.out, opts)
    if counts["failed"]:
        print(f"sinklab: error: {counts['failed']} of {sum(counts.values())} cells failed (their "
              f"reasons: `sinklab results {args.out} --status failed`); `--retry-failed` runs "
              "them again.", file=sys.stderr)
        return EXIT_DIVERGED
    return 0


def cmd_results(args: argparse.Namespace, argv: list[str]) -> int:
    list_results = heavy("sweeps.listing").list_results
    return list_results(Path(args.dir), args.status, args.where,
                        Path(args.csv) if args.csv else None, args.by)


def cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    command = "sinklab " + " ".join(shlex.quote(a) for a in argv)
    result = heavy("report").run_report(
        Path(args.dir), Path(args.out) if args.out else None, command)
    for kind, folder in result["found"]:
        print(f"  {kind:9s} {folder}")
    for reason in result["skipped"]:
        print(f"sinklab: left out: {reason}", file=sys.stderr)
    print(f"wrote {Path(result['out']) / 'REPORT.html'} and REPORT.md")
    return 0


def cmd_worst(args: argparse.Namespace, argv: list[str]) -> int:
    # the options, then every RUN (a diverged run, weights beyond the certificate's range) are
    # checked before any run is measured
    worst_runs = heavy("theory.bounds").worst_runs
    for line in worst_runs([Path(run) for run in args.runs], steps=args.attack_steps,
                           restarts=args.restarts, seconds=args.certify_seconds):
        print(line, flush=True)
    return 0


def cmd_render(args: argparse.Namespace, argv: list[str]) -> int:
    for docs in args.docs:
        name, same = heavy("studies.render").render_docs(Path(docs))
        print(f"wrote {docs} ({name}): the claims decided again from its records are "
              + ("the ones recorded" if same else "not the ones recorded; the report now says "
                 "what the code decides"))
    return 0


def _shown(module: str) -> str:
    """A plugin as ``sinklab rules`` shows it: a file below the current folder relative to it."""
    if not os.path.isabs(module):
        return module
    relative = os.path.relpath(module)
    return module if relative.startswith("..") else relative


def _add_birth(sub: Any, common: argparse.ArgumentParser) -> None:
    bp = sub.add_parser(
        "birth", parents=[common], help="watch a softmax sink being born in a small language "
                                        "model (about 10 minutes on two cores)",
        description="Train one small byte-level language model (4 layers of width 128, softmax) "
                    "on the BBC News text at a constant rate, print each measurement as it is "
                    "logged (validation loss, Gu et al.'s sink rate, first-token mass, the heads "
                    "that sink), and end with when the sink appeared and birth.png, its "
                    "emergence curve. A stopped run resumes from its checkpoint when rerun.")
    bp.add_argument("--out", type=given, default="runs/birth", metavar="DIR",
                    help="the run folder (default: runs/birth); rerun to resume")
    bp.add_argument("--tokens", type=int, default=birth.TOKENS, metavar="N",
                    help=f"training tokens (default: {birth.TOKENS:,})")
    bp.add_argument("--seed", type=int, default=birth.SEED, metavar="S",
                    help=f"seed (default: {birth.SEED}, a pilot seed whose sink forms within the "
                         "default budget; other seeds may sink later or not at all)")
    bp.add_argument("--device", default="auto", metavar="DEVICE",
                    help="auto, cpu or cuda (default: auto)")


def cmd_birth(args: argparse.Namespace, argv: list[str]) -> int:
    check_count("--tokens", args.tokens)
    cfg = birth.config(args.tokens, args.seed, args.device)
    started = Usage.now()
    with folders.writing(Path(args.out), "run"):
        result = birth.watch(Path(args.out), cfg, say=lambda text: print(text, flush=True))
    print(result["verdict"])
    print(f"wrote {result['figure']}; {took(started, {}, 'local')}")
    return 0


def cmd_rules(args: argparse.Namespace, argv: list[str]) -> int:
    rules = heavy("attention").RULES

    for name, info in sorted(rules.items()):
        learned = "learned parameters" if info.parameters else "no parameters"
        origin = "" if info.module == "sinklab" else f"; plugin {_shown(info.module)}"
        print(f"{name:10s} rows: {info.row_kind}; {learned}{origin}. {info.description}")
        for arg, spec in info.kwargs.items():
            default = "none" if spec.default is None else spec.default
            print(f"{'':10s}   model.attention_args.{arg}: {spec.type_text()} = {default} -- "
                  f"{spec.help}; {spec.words()}")
    return 0


def _one_line(text: str, most: int = 1000) -> str:
    """The text on one line, and not endless (a 100,000-character value in a spec)."""
    line = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    return line if len(line) <= most else f"{line[:most - 250]} [...] {line[-240:]}"


OS_HINTS = {
    errno.ENOSPC: "free some space and run the same command again; finished work is kept",
    errno.EDQUOT: "free some space and run the same command again; finished work is kept",
    errno.EACCES: "choose a place you may write to",
    errno.EPERM: "choose a place you may write to",
    errno.EROFS: "the file system is read-only; choose another place",
    errno.ENAMETOOLONG: "the name is longer than the file system allows; choose a shorter one",
    errno.ENOTDIR: "a part of that path is a file, not a folder",
    errno.EISDIR: "that is a folder; give a file name",
    errno.EEXIST: "it exists already",
    errno.ENOENT: "it does not exist",
}


def describe_error(exc: BaseException) -> tuple[str, int]:
    """The one sentence ``main`` prints for an error, and the exit status."""
    if isinstance(exc, SinklabError):
        return _one_line(exc), EXIT_INPUT
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        reason = exc.strerror or type(exc).__name__
        hint = OS_HINTS.get(exc.errno or 0)
        return _one_line(f"{where + ': ' if where else ''}{reason}"
                         + (f" ({hint})" if hint else "") + "."), EXIT_INPUT
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(
            words in str(exc) for words in ("can't allocate memory", "out of memory"))):
        return ("ran out of memory; lower the sizes, or SINKLAB_MAX_MEMORY so that sinklab "
                "refuses such runs before it starts them."), EXIT_INPUT
    if isinstance(exc, sqlite3.Error):
        return _one_line(f"the results database failed ({type(exc).__name__}: {exc}); finished "
                         "cells are kept, run the same command again."), EXIT_INPUT
    first = _one_line(str(exc).split("\n")[0])[:300]
    return (f"internal error ({type(exc).__name__}: {first}); run again with --debug for the "
            "traceback, and please report it."), EXIT_INTERNAL


@dataclass(frozen=True)
class Command:
    """One of sinklab's own commands: what adds its subcommand to the parser, and what runs
    it. Every other subcommand is a registered study (``sinklab.studies``)."""

    add: Callable[[Any, argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]


COMMANDS = {  # in the order ``sinklab --help`` lists them, after the studies
    "train": Command(_add_train, cmd_train),
    "plot": Command(_add_plot, cmd_plot),
    "sweep": Command(_add_sweep, cmd_sweep),
    "results": Command(_add_results, cmd_results),
    "report": Command(_add_report, cmd_report),
    "worst": Command(_add_worst, cmd_worst),
    "render": Command(_add_render, cmd_render),
    "rules": Command(_add_rules, cmd_rules),
    "birth": Command(_add_birth, cmd_birth),
}


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's stop) ends the command as Ctrl-C does: as a
    KeyboardInterrupt, so that worker pools are shut down, temporary files removed and the
    same sentence says what is kept. A second SIGTERM ends it at once. Only the main thread may
    set a handler (tests call ``main`` from others too); the previous one comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    restore = signal.SIG_DFL if previous is None else previous  # None: set outside Python

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, restore)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, restore)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # `sinklab train --out DIR key=value`: overrides may follow the options too
        if args.command == "train" and all("=" in a and not a.startswith("-") for a in extra):
            args.overrides += extra
        elif extra:
            prog = f"sinklab {args.command}" if args.command else "sinklab"
            Parser(prog=prog).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    debug = args.debug or os.environ.get(DEBUG_ENV, "").strip().lower() not in (
        "", "0", "false", "no", "off")
    started = Usage.now()
    try:
        with terminate_as_interrupt():
            plugins = heavy("plugins")

            plugins.load_all(args.plugins_first + getattr(args, "plugins", []))
            if args.command in COMMANDS:
                return COMMANDS[args.command].run(args, argv)
            return cmd_study(studies.get(args.command), args, argv, started)
    except KeyboardInterrupt as exc:  # a study may say exactly what it keeps
        kept = str(exc) if isinstance(exc, Interrupted) and str(exc) else \
            "finished runs are kept on disk"
        print(f"sinklab: interrupted; {kept}.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # every error ends as one sentence; tracebacks only on request
        if debug:
            traceback.print_exc()
        sentence, code = describe_error(exc)
        print(f"sinklab: error: {sentence}", file=sys.stderr)
        return code
