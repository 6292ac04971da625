"""``sinklab extensions``: sweeps past the paper's single setting, for softmax and ReLU.

Every sweep trains 1x1 models (and 2x2 where it says so) with the zoo's budget and logging at the
middle learning rate of the zoo's grid (``studies.zoo``), as ensembles over the seeds, into the
zoo's folder names (``runs/1x1_relu_lr0.001_L32_seed0``), so a zoo folder's runs can be adopted
(``--reuse DIR``) instead of trained again:

- sequence length: train and test at ``seq_len`` in 8..128;
- trigger frequency: train with sequences that have no trigger or several
  (``task.no_trigger_prob``, ``task.max_triggers``), test on the paper's test set and on one
  shared mixed test set;
- length generalisation: the L = 16 models tested at L = 16, 32 and 64 (no training);
- the standard block: pre-LayerNorm and an MLP (``model.block=standard``) against attention only;
- sink emergence: non-trigger BOS mass and error against the training step, from the runs'
  training logs.

    sinklab extensions --out results/extensions                 # 3 seeds
    sinklab extensions --reuse results/zoo --out results/ext    # adopt the zoo's finished runs
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.config import (
    RunConfig,
    TaskConfig,
    check_count,
)
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.runs import limits
from sinklab.runs.files import read_log
from sinklab.studies import zoo as zoo_study
from sinklab.studies.base import (
    Cell,
    Context,
    Execution,
    FigureSpec,
    Study,
    check_reuse,
    named,
)

RULES = ("softmax", "relu")
# What the theorem predicts of each rule: softmax must sink to solve the task, ReLU need not
# (its all-zero rows output zero), so the sink claims are "every seed sinks" and "no seed does".
EXPECTS_SINK = {"softmax": True, "relu": False}
LR = {c: zoo_study.middle_lr(c) for c in zoo_study.CONFIGS}  # the middle rate of each grid
SEQ_LENS = (8, 16, 32, 64, 128)
QUICK_SEQ_LENS = (8, 16, 32)
FREQUENCIES = ((0.0, 1), (0.25, 1), (0.5, 1), (0.9, 1), (0.0, 2), (0.0, 4), (0.5, 4))
QUICK_FREQUENCIES = ((0.0, 1), (0.5, 1), (0.0, 3))
EVAL_LENGTHS = (16, 32, 64)
BLOCKS = ("attention", "standard")
# The shared test set of the trigger-frequency sweep: a third of the sequences without a
# trigger, the rest with 1-4 triggers (so half of all sequences have several).
MIXED = TaskConfig(no_trigger_prob=1 / 3, max_triggers=4)
MIXED_SEQUENCES = 1500
SINK_STEP_LEVELS = (0.5, 0.9)  # first step with the most sinking head at this BOS weight
ERROR_DROP = 0.1  # first step with the training batch L∞ below this
MOVED = 0.5  # a sink "moved" when a head puts this much of a non-trigger row on the query itself
# An error on a condition the model was not trained on (a longer sequence, several triggers)
# "stays" when it is within this factor of the same model's error on the condition it was.
GENERALISE_FACTOR = 2.0
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1
CACHE_VERSION = 1


@dataclass
class ExtensionsOptions:
    """What ``sinklab extensions`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds per setting (default: {DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick); "
                "docs/studies.toml sets the committed report's", "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test: {QUICK_SEEDS} seed, fewer lengths and frequencies, 1x1 blocks "
                "only, the zoo's quick budgets"})
    reuse: Path | None = field(default=None, metadata={
        "help": "another sinklab folder (a zoo or extensions folder) whose finished runs of the "
                "same names and settings are hard-linked (or copied) in instead of trained",
        "metavar": "DIR"})

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        check_count(named(self, "seeds"), self.seeds)
        if self.reuse is not None:
            self.reuse = Path(self.reuse)
        per_seed = len(RULES) * (len(seq_lens(self)) + len(frequencies(self))
                                 + len(block_configs(self)) * len(BLOCKS))
        limits.check_cells(self.seeds * per_seed, f"{named(self, 'seeds')} {self.seeds}")


def seq_lens(opts: ExtensionsOptions) -> tuple[int, ...]:
    return QUICK_SEQ_LENS if opts.quick else SEQ_LENS


def frequencies(opts: ExtensionsOptions) -> tuple[tuple[float, int], ...]:
    return QUICK_FREQUENCIES if opts.quick else FREQUENCIES


def block_configs(opts: ExtensionsOptions) -> tuple[str, ...]:
    return ("1x1",) if opts.quick else ("1x1", "2x2")


# --------------------------------------------------------------------------- the runs


def setting_name(task: dict[str, Any], model: dict[str, Any]) -> str:
    """A run folder's suffix for the settings that differ from the paper's ("" for none)."""
    parts = []
    if task.get("seq_len", 16) != 16:
        parts.append(f"_L{task['seq_len']}")
    if task.get("no_trigger_prob", 0.0):
        parts.append(f"_none{task['no_trigger_prob']:g}")
    if task.get("max_triggers", 1) != 1:
        parts.append(f"_k{task['max_triggers']}")
    if model.get("block", "attention") != "attention":
        parts.append(f"_{model['block']}")
    return "".join(parts)


def _frequency_task(p: float, k: int) -> dict[str, Any]:
    return {"no_trigger_prob": p, "max_triggers": k}


def run_name(config: str, rule: str, seed: int, task: dict[str, Any] | None = None,
             model: dict[str, Any] | None = None) -> str:
    return zoo_study.run_name(config, rule, LR[config], seed,
                              setting_name(task or {}, model or {}))


def run_config(config: str, rule: str, seed: int, opts: ExtensionsOptions, device: str,
               task: dict[str, Any] | None = None, model: dict[str, Any] | None = None
               ) -> RunConfig:
    return zoo_study.run_config(config, rule, LR[config], seed, opts.quick, device, task, model)


def _cell(opts: ExtensionsOptions, exe: Execution, sweep: str, config: str, rule: str, seed: int,
          task: dict[str, Any], model: dict[str, Any], tag: str) -> Cell:
    name = setting_name(task, model)
    return Cell(run_name(config, rule, seed, task, model),
                run_config(config, rule, seed, opts, exe.device, task, model),
                group=(sweep, config, rule, name), label=f"{config} {rule} {tag}")


def cells(opts: ExtensionsOptions, exe: Execution) -> list[Cell]:
    """Every run the sweeps need; the L = 16 attention-only run is named by three sweeps (and
    read by two more) and trained once. Length generalisation and emergence train nothing."""
    result = []
    for rule in RULES:
        for seed in range(opts.seeds):
            for n in seq_lens(opts):
                result.append(_cell(opts, exe, "seq_len", "1x1", rule, seed, {"seq_len": n}, {},
                                    f"L={n}"))
            for p, k in frequencies(opts):
                result.append(_cell(opts, exe, "trigger", "1x1", rule, seed,
                                    _frequency_task(p, k), {}, f"no-trigger {p:g}, <= {k}"))
            for config in block_configs(opts):
                for block in BLOCKS:
                    result.append(_cell(opts, exe, "block", config, rule, seed, {},
                                        {"block": block}, f"{block} block"))
    return result


# ------------------------------------------------------------------- evaluations (cached)


def _max_head(values: Any) -> float:
    return float(np.max(values))


def _cached(ctx: Context, what: str, name: str, compute: Any) -> Any:
    """``compute(path)`` for the run ``name``, kept in ``cache/`` with the model it read."""
    path = ctx.out / name
    settings = {"version": CACHE_VERSION, "model": zoo_study.model_digest(path),
                "lengths": list(EVAL_LENGTHS), "mixed_sequences": MIXED_SEQUENCES}
    return ctx.cached(f"ext_{what}_{name.removeprefix('runs/')}", settings,
                      lambda: {"value": compute(path)})["value"]


# ------------------------------------------------------------------------------ records


def is_sink(run: dict[str, Any]) -> bool:
    """A sink head: non-trigger BOS weight (absolute) at least ``SINK_HEAD_THRESHOLD``."""
    return run["bos_max"] >= SINK_HEAD_THRESHOLD


def _run(ctx: Context, name: str) -> dict[str, Any]:
    s = ctx.summary(name)
    return {"seed": s["seed"], "converged": s["converged"], "steps": s["steps"],
            "test_linf": s["linf_error"], "mse": s["mse"],
            "linf_nontrigger": s["linf_nontrigger"], "linf_trigger": s["linf_trigger"],
            "bos_max": _max_head(s["bos_mass_nontrigger"]), "sink_heads": s["sink_heads"]}


def first_step(log: list[dict[str, Any]], key: str, test: Any) -> int | None:
    """The first logged step whose value passes ``test``, or None."""
    return next((row["step"] for row in log if test(row[key])), None)


def emergence(path: Path) -> dict[str, Any]:
    """A run's training curve (most sinking head's BOS weight, batch L∞) and its landmarks."""
    log = read_log(path / "metrics.jsonl")
    for row in log:
        row["bos_max"] = _max_head(row["bos_mass_nontrigger"])
    result = {"step": [r["step"] for r in log], "bos_max": [r["bos_max"] for r in log],
              "train_linf": [r["train_linf"] for r in log],
              "error_drop_step": first_step(log, "train_linf", lambda v: v < ERROR_DROP)}
    for level in SINK_STEP_LEVELS:
        result[f"bos{level:g}_step"] = first_step(log, "bos_max", lambda v, t=level: v >= t)
    return result


def fate(run: dict[str, Any]) -> str:
    """What one seed's heads do at non-trigger rows: keep a sink on BOS ("sink"), put their row
    on the query itself ("self"), or neither ("none")."""
    if is_sink(run):
        return "sink"
    return "self" if run["self_max"] >= MOVED else "none"


def _group(rows: list[dict[str, Any]], **keys: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def _summary(rows: list[dict[str, Any]], keys: dict[str, Any], values: tuple[str, ...]
             ) -> dict[str, Any]:
    """One setting of a sweep over its seeds: per-seed lists of ``values``, the counts."""
    return {**keys, "n": len(rows), "converged": sum(r["converged"] for r in rows),
            "sinks": sum(is_sink(r) for r in rows),
            **{v: [r[v] for r in rows] for v in values}}


def _median(values: list[int | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    return {"median": float(np.median(known)) if known else None, "known": len(known),
            "n": len(values)}


def _protocol(opts: ExtensionsOptions, exe: Execution) -> dict[str, Any]:
    cfg = run_config("1x1", "softmax", 0, opts, exe.device)
    return {"lr": LR, "steps": {c: zoo_study.steps(c, opts.quick) for c in zoo_study.CONFIGS},
            "tol": cfg.train.tol, "eval_sequences": cfg.eval.n_sequences,
            "train_trigger_min": cfg.task.train_trigger_min,
            "eval_trigger": cfg.task.eval_trigger, "seq_len": cfg.task.seq_len,
            "log_every": cfg.train.log_every, "sink_head": SINK_HEAD_THRESHOLD,
            "moved": MOVED, "generalise_factor": GENERALISE_FACTOR, "error_drop": ERROR_DROP,
            "sink_step_levels": list(SINK_STEP_LEVELS), "eval_lengths": list(EVAL_LENGTHS),
            "mixed": {"no_trigger_prob": MIXED.no_trigger_prob,
                      "max_triggers": MIXED.max_triggers, "sequences": MIXED_SEQUENCES},
            "seq_lens": list(seq_lens(opts)), "frequencies": [list(f) for f in frequencies(opts)],
            "block_configs": list(block_configs(opts))}


def collect(ctx: Context) -> dict[str, Any]:
    """Every sweep's runs (one row per run and seed) and each setting over its seeds."""
    opts = ctx.opts
    from sinklab import measure  # torch: the declaration also serves the help texts

    seeds = range(opts.seeds)
    seq, trig, block, length, emerge, curves = [], [], [], [], [], []
    for rule in RULES:
        for n in seq_lens(opts):
            for s in seeds:
                seq.append({"rule": rule, "seq_len": n,
                            **_run(ctx, run_name("1x1", rule, s, {"seq_len": n}))})
        for p, k in frequencies(opts):
            for s in seeds:
                name = run_name("1x1", rule, s, _frequency_task(p, k))
                trig.append({"rule": rule, "no_trigger_prob": p, "max_triggers": k,
                             **_run(ctx, name), **{f"mixed_{key}": v for key, v in _cached(
                                 ctx, "mixed", name, lambda path: measure.mixed_evaluation(
                                     path, MIXED, MIXED_SEQUENCES)).items()}})
        for config in block_configs(opts):
            for b in BLOCKS:
                for s in seeds:
                    name = run_name(config, rule, s, model={"block": b})
                    row = {"config": config, "rule": rule, "block": b, **_run(ctx, name),
                           "self_max": measure.self_mass(ctx.out / name)}
                    block.append({**row, "fate": fate(row)})
            # the paper's models (attention blocks at L = 16): tested longer, and their curves
            for s in seeds:
                name = run_name(config, rule, s)
                base = _run(ctx, name)
                for t in _cached(ctx, "lengths", name,
                                 lambda path: measure.length_evaluation(path, EVAL_LENGTHS)):
                    length.append({"config": config, "rule": rule, "seed": s,
                                   "converged": base["converged"], **t})
                e = emergence(ctx.out / name)
                curves.append({"config": config, "rule": rule, "seed": s, "step": e["step"],
                               "bos_max": e["bos_max"], "train_linf": e["train_linf"]})
                emerge.append({"config": config, "rule": rule, "seed": s,
                               "converged": base["converged"], "steps": base["steps"],
                               "bos_step0": e["bos_max"][0] if e["bos_max"] else None,
                               **{k: v for k, v in e.items()
                                  if k.endswith("_step") and k != "step"}})
    values = ("seed", "steps", "test_linf", "linf_nontrigger", "linf_trigger", "bos_max",
              "sink_heads")
    mixed = ("mixed_linf_none", "mixed_linf_one", "mixed_linf_several", "mixed_bos_max")
    return {
        "protocol": _protocol(opts, ctx.exe),
        "seq_len": seq, "trigger": trig, "block": block, "length": length,
        "emergence": emerge, "curves": curves,
        "seq_len_groups": [_summary(_group(seq, rule=r, seq_len=n), {"rule": r, "seq_len": n},
                                    values) for r in RULES for n in seq_lens(opts)],
        "trigger_groups": [_summary(_group(trig, rule=r, no_trigger_prob=p, max_triggers=k),
                                    {"rule": r, "no_trigger_prob": p, "max_triggers": k},
                                    values + mixed)
                           for r in RULES for p, k in frequencies(opts)],
        "block_groups": [_block_group(_group(block, config=c, rule=r, block=b),
                                      {"config": c, "rule": r, "block": b}, values)
                         for c in block_configs(opts) for r in RULES for b in BLOCKS],
        "emergence_groups": [_emergence_group(_group(emerge, config=c, rule=r), c, r)
                             for c in block_configs(opts) for r in RULES],
    }


def _block_group(rows: list[dict[str, Any]], keys: dict[str, Any], values: tuple[str, ...]
                 ) -> dict[str, Any]:
    return {**_summary(rows, keys, values + ("self_max", "fate")),
            "fates": {f: sum(r["fate"] == f for r in rows) for f in ("sink", "self", "none")}}


def _emergence_group(rows: list[dict[str, Any]], config: str, rule: str) -> dict[str, Any]:
    return {"config": config, "rule": rule, "n": len(rows),
            "converged": sum(r["converged"] for r in rows),
            "bos_step0": [r["bos_step0"] for r in rows],
            **{f"bos{level:g}_step": _median([r[f"bos{level:g}_step"] for r in rows])
               for level in SINK_STEP_LEVELS},
            "error_drop_step": _median([r["error_drop_step"] for r in rows]),
            "stop_step": _median([r["steps"] for r in rows])}


# ------------------------------------------------------------------------------- claims


def _sink_claim(key: str, where: str, rule: str, rows: list[dict[str, Any]]) -> Claim:
    """The theorem's prediction for ``rule`` over the seeds ``rows``: every softmax seed has a
    sink head, no ReLU seed does."""
    k, n = sum(is_sink(r) for r in rows), len(rows)
    what = f"have a sink head (non-trigger BOS weight >= {SINK_HEAD_THRESHOLD:g})"
    if EXPECTS_SINK[rule]:
        return cl.every(key, f"Every {rule} seed {where} has a sink head", k, n, what)
    return cl.none(key, f"No {rule} seed {where} has a sink head", k, n, what)


def _within(ratio_of: float | None, base: float | None) -> bool:
    """Whether an error stays within ``GENERALISE_FACTOR`` of the base error (two zeros do)."""
    if ratio_of is None or base is None:
        return False
    return ratio_of <= GENERALISE_FACTOR * base


def claims(records: dict[str, Any], opts: ExtensionsOptions) -> list[Claim]:
    """The sweeps' verdicts over seeds: sink fate per setting, whether the model solves, how
    its errors carry over to unseen lengths and trigger counts, and when the sink forms."""
    out: list[Claim] = []
    tol = records["protocol"]["tol"]
    f = GENERALISE_FACTOR
    for rule in RULES:
        for n in seq_lens(opts):
            rows = _group(records["seq_len"], rule=rule, seq_len=n)
            out.append(cl.every(f"seq_len.{rule}.L{n}.solves",
                                f"Every {rule} seed trained at L = {n} reaches the stop rule",
                                sum(r["converged"] for r in rows), len(rows), "reached it"))
            out.append(_sink_claim(f"seq_len.{rule}.L{n}.sink", f"trained at L = {n}", rule,
                                   rows))
    for rule in RULES:
        for p, k in frequencies(opts):
            rows = _group(records["trigger"], rule=rule, no_trigger_prob=p, max_triggers=k)
            setting = f"p{p:g}_k{k}"
            words = f"trained with P(no trigger) = {p:g} and at most {k} trigger(s)"
            out.append(_sink_claim(f"trigger.{rule}.{setting}.sink", words, rule, rows))
            out.append(cl.every(
                f"trigger.{rule}.{setting}.several",
                f"Every {rule} seed {words} keeps its L∞ on the mixed set's sequences with "
                f"several triggers within {f:g}x its L∞ on those with one",
                sum(_within(r["mixed_linf_several"], r["mixed_linf_one"]) for r in rows),
                len(rows), f"stay within {f:g}x"))
    for config in block_configs(opts):
        for rule in RULES:
            rows = _group(records["block"], config=config, rule=rule, block="standard")
            where = f"of the {config} standard block"
            out.append(cl.every(f"block.{config}.{rule}.solves",
                                f"Every {rule} seed {where} reaches the stop rule",
                                sum(r["converged"] for r in rows), len(rows), "reached it"))
            out.append(_sink_claim(f"block.{config}.{rule}.sink", where, rule, rows))
            out.append(cl.none(
                f"block.{config}.{rule}.self",
                f"No {rule} seed {where} moves its non-trigger rows onto the query itself",
                sum(r["self_max"] >= MOVED for r in rows), len(rows),
                f"have a head with self weight >= {MOVED:g} at non-trigger rows"))
    length = records["length"]
    for config in block_configs(opts):
        for rule in RULES:
            rows = _group(length, config=config, rule=rule)
            seeds = sorted({r["seed"] for r in rows if r["converged"]})
            trained = records["protocol"]["seq_len"]

            def of(seed: int, rows: list[dict[str, Any]] = rows) -> list[dict[str, Any]]:
                return [r for r in rows if r["seed"] == seed]

            zero = sum(all(t["linf_nontrigger"] <= tol for t in of(s)) for s in seeds)
            out.append(cl.every(
                f"length.{config}.{rule}.nontrigger",
                f"Every converged {config} {rule} seed trained at L = {trained} keeps its "
                f"non-trigger L∞ below the stop tolerance {tol:g} at every tested length",
                zero, len(seeds), "(the converged ones) stay below it"))
            base = {s: next(t["linf_trigger"] for t in of(s) if t["seq_len"] == trained
                            and t["trigger"] == records["protocol"]["eval_trigger"])
                    for s in seeds}
            kept = sum(all(_within(t["linf_trigger"], base[s]) for t in of(s)) for s in seeds)
            out.append(cl.every(
                f"length.{config}.{rule}.trigger",
                f"Every converged {config} {rule} seed keeps its trigger-row L∞ within "
                f"{f:g}x its L = {trained} value at every tested length and trigger position",
                kept, len(seeds), f"(the converged ones) stay within {f:g}x"))
    level = max(SINK_STEP_LEVELS)
    for config in block_configs(opts):
        for rule in RULES:
            rows = _group(records["emergence"], config=config, rule=rule)
            if EXPECTS_SINK[rule]:
                early = sum(r[f"bos{level:g}_step"] is not None
                            and r["error_drop_step"] is not None
                            and r[f"bos{level:g}_step"] < r["error_drop_step"] for r in rows)
                out.append(cl.every(
                    f"emergence.{config}.{rule}.sink_first",
                    f"In every {config} {rule} seed the sink forms before the error drops (the "
                    f"most sinking head reaches BOS weight {level:g} at an earlier logged step "
                    f"than the training batch L∞ falls below {ERROR_DROP:g})",
                    early, len(rows), "form the sink first"))
            else:
                low = min(SINK_STEP_LEVELS)
                out.append(cl.none(
                    f"emergence.{config}.{rule}.never",
                    f"No {config} {rule} seed's most sinking head reaches BOS weight {low:g} at "
                    "any logged training step", sum(r[f"bos{low:g}_step"] is not None
                                                    for r in rows),
                    len(rows), f"reach BOS weight {low:g}"))
    return out


# ------------------------------------------------------------------------------ figures

COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}


def _scatter_line(ax: Any, xs: list[Any], per_x: list[list[float]], rule: str) -> None:
    for x, values in zip(xs, per_x):
        ax.scatter([x] * len(values), values, color=COLORS[rule], s=10, alpha=0.6)
    ax.plot(xs, [float(np.mean(v)) for v in per_x], color=COLORS[rule], label=rule)


def _draw_seq_len(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    ax_bos, ax_err = axes[0]
    for rule in RULES:
        sel = [g for g in records["seq_len_groups"] if g["rule"] == rule]
        xs = [g["seq_len"] for g in sel]
        _scatter_line(ax_bos, xs, [g["bos_max"] for g in sel], rule)
        _scatter_line(ax_err, xs, [g["test_linf"] for g in sel], rule)
    for ax, title in ((ax_bos, "non-trigger BOS weight, most sinking head"),
                      (ax_err, "test L∞ error (log)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seq_len (train and test)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")
    ax_err.axhline(records["protocol"]["tol"], color="grey", ls="--", lw=0.8)


def _draw_trigger(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    ax_bos, ax_err = axes[0]
    width = 0.4
    for i, rule in enumerate(RULES):
        sel = [g for g in records["trigger_groups"] if g["rule"] == rule]
        xs = np.arange(len(sel)) + (i - 0.5) * width
        ax_bos.bar(xs, [float(np.mean(g["bos_max"])) for g in sel], width, color=COLORS[rule],
                   label=rule)
        ax_err.bar(xs, [float(np.mean(g["test_linf"])) for g in sel], width,
                   color=COLORS[rule], label=rule)
    labels = [f"p={g['no_trigger_prob']:g}\nk<={g['max_triggers']}"
              for g in records["trigger_groups"] if g["rule"] == RULES[0]]
    for ax, title in ((ax_bos, "non-trigger BOS weight (paper test set)"),
                      (ax_err, "test L∞ error (paper test set, log)")):
        ax.set_xticks(np.arange(len(labels)), labels, fontsize=7)
        ax.set_title(title + "; p = P(no trigger), k = max triggers", fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")


def _configs(records: dict[str, Any]) -> list[str]:
    return list(records["protocol"]["block_configs"])


def _grid(axes: Any) -> np.ndarray:
    """Axes as a 2-D array (a 1 x 1 grid is handed over as one Axes)."""
    return np.atleast_2d(np.asarray(axes, dtype=object))


def _draw_length(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    for ax, config in zip(_grid(axes)[0], _configs(records)):
        for rule in RULES:
            tests = _group(records["length"], config=config, rule=rule)
            for far, style in ((False, "-"), (True, ":")):
                sel = [t for t in tests if (t["trigger"] == t["seq_len"] - 1) == far]
                xs = sorted({t["seq_len"] for t in sel})
                ys = [float(np.mean([t["linf_nontrigger"] for t in sel if t["seq_len"] == x]))
                      for x in xs]
                where = "at L - 1" if far else f"at {records['protocol']['eval_trigger']}"
                ax.plot(xs, ys, style, marker="o", color=COLORS[rule],
                        label=f"{rule}, trigger {where}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-5)  # an exact zero (ReLU's off rows) stays visible
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"test seq_len (trained at {records['protocol']['seq_len']})")
        ax.set_title(f"{config}: L∞ error at non-trigger rows (symlog, linear below 1e-5)",
                     fontsize=9)
        ax.legend(fontsize=7)


def _draw_block(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    groups = records["block_groups"]
    labels = [f"{g['config']} {g['rule']}\n{g['block']}" for g in groups]
    for ax, key, title in ((axes[0][0], "bos_max", "BOS weight, most sinking head"),
                           (axes[0][1], "self_max", "self weight, most self-attending head")):
        for x, g in enumerate(groups):
            ax.bar(x, float(np.mean(g[key])), color=COLORS[g["rule"]],
                   alpha=1.0 if g["block"] == "attention" else 0.5)
            ax.scatter([x] * len(g[key]), g[key], color="black", s=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"non-trigger rows: {title}", fontsize=9)


def _draw_emergence(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    for row, config in zip(_grid(axes), _configs(records)):
        for rule in RULES:
            for i, c in enumerate(_group(records["curves"], config=config, rule=rule)):
                label = rule if i == 0 else None
                row[0].plot(c["step"], c["bos_max"], color=COLORS[rule], lw=0.8, label=label)
                row[1].plot(c["step"], c["train_linf"], color=COLORS[rule], lw=0.8, label=label)
        row[0].set_title(f"{config}: non-trigger BOS weight (training batch, most sinking head)",
                         fontsize=9)
        row[1].set_title(f"{config}: training batch L∞ error (log)", fontsize=9)
        row[1].set_yscale("log")
        row[1].axhline(ERROR_DROP, color="grey", ls="--", lw=0.8)
        for ax in row:
            ax.set_xlabel("training step")
            ax.legend(fontsize=7)


FIGURES = (
    FigureSpec("fig_ext_seq_len", _draw_seq_len, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_trigger", _draw_trigger, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_length", _draw_length,
               grid=lambda records, opts: (1, len(_configs(records))), size=(5.5, 3.8)),
    FigureSpec("fig_ext_block", _draw_block, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_emergence", _draw_emergence,
               grid=lambda records, opts: (len(_configs(records)), 2), size=(5.5, 3.6)),
)


def _reuse(opts: ExtensionsOptions) -> list[Path]:
    return [opts.reuse] if opts.reuse is not None else []


def _check(opts: ExtensionsOptions, exe: Execution, out: Path) -> None:
    """Before anything is written: ``--reuse`` names a study's folder of sinklab's."""
    if opts.reuse is not None:
        check_reuse(opts.reuse, named(opts, "reuse"))


STUDY = Study(
    name="extensions",
    title="Extensions: past the paper's setting",
    help="softmax and ReLU past the paper: lengths, trigger counts, blocks, emergence",
    description="Train softmax and ReLU 1x1 (and 2x2) models at other sequence lengths, "
                "trigger frequencies and with the standard block (LayerNorm and an MLP), test "
                "the L = 16 models at longer lengths, and follow the sink during training; "
                "every verdict is a claim over seeds. The runs have the zoo's names, budget "
                "and settings, so --reuse ZOO_FOLDER adopts a zoo folder's finished runs "
                "instead of training them. Writes runs, figures, records.json, claims.csv, one "
                "CSV per sweep and EXTENSIONS.md. Rerunning with the same --out resumes: "
                "finished runs are kept.",
    options=ExtensionsOptions, template="extensions.md.j2", collect=collect, cells=cells,
    claims=claims, figures=FIGURES,
    tables=("seq_len", "trigger", "block", "length", "emergence"), report="EXTENSIONS.md",
    reuse=_reuse, check=_check, docs_example="docs/extensions.md",
    default_out="results/extensions")
