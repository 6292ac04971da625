"""``sinklab zoo``'s analysis: its later rounds of runs, its records and its figures.

The runner imports this module when the study runs or renders (``Study.analysis``) and reads
``more_cells`` (the runs each (configuration, rule) needs next: the learning-rate search's next
rate, ``sinklab.studies.search``, or fresh and denied seeds at the rate found), ``collect``
(records from the finished runs, with one cached pass over each fresh model: ``model_checks``),
``claims`` and ``complete`` (``sinklab.studies.zoo_claims``) and ``FIGURES``. The declaration
(options, the runs' names and settings) is ``sinklab.studies.zoo``; the capacity arguments that
label a (configuration, rule) "cannot express" are ``sinklab.theory.capacity``.

    sinklab zoo --quick --out /tmp/zoo        # runs it; `sinklab render docs/zoo.md` renders
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from sinklab import measure, stats
from sinklab.attention import RULES
from sinklab.config import build_run_config
from sinklab.definitions import GU_EPS, OFF_ROW, default_source
from sinklab.metrics import in_shares
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.studies import zoo
from sinklab.studies.search import Search, rate_score, replay
from sinklab.studies.study import Cell, Context, Execution, FigureSpec
from sinklab.studies.zoo_claims import SINK_SHARE, count_ends, outcome, relabel, share_label
from sinklab.studies.zoo_claims import claims as claims
from sinklab.theory import expressivity as ex
from sinklab.theory import floors
from sinklab.theory.capacity import (
    CAPACITY,
    CAPACITY_SEQUENCES,
    SEQUENCE_ARGUMENTS,
    capacity_applies,
    capacity_bounds,
    model_argument_error,
    no_other_zero,
)

VALIDATION_SEED = 1  # the test set is eval.seed = 0
SOURCES = ("BOS", "sink logit", "learned key", "closed gate", "clipped to zero", "zero row",
           "content")
ON_SOURCES = ("BOS", "content")  # sources of heads whose non-trigger rows are on
# The relative Gu rate ignores a row whose sum is below this fraction of its head's mean
# trigger-row sum: the report's one definition of a row that is off (``default_source``). Such
# a row writes less than a fifth of what the head writes where it must write the average;
# divided by its own small sum it would count as much as a row that is on.
GU_ROW_FLOOR = OFF_ROW
ABLATION_KEYS = ("linf_trigger", "linf_nontrigger", "mse_trigger", "mse_nontrigger")
CACHE_VERSION = 3  # bump when model_checks computes something else


# ------------------------------------------------------------------ the learning-rate search


def _finished_summary(ctx: Context, name: str) -> dict[str, Any] | None:
    path = ctx.out / name
    return ctx.summary(name) if folders.check_complete(path) else None


def search(ctx: Context, config: str, rule: str) -> Search:
    """Replay the search of (config, rule) from its finished screening runs."""
    opts = ctx.opts

    def runs_at(lr: float) -> list[dict[str, Any]] | None:
        runs = [_finished_summary(ctx, zoo.run_name("screen", config, rule, lr, s))
                for s in zoo.screen_seeds(opts)]
        return None if any(r is None for r in runs) else runs  # type: ignore[return-value]

    return replay(zoo.start_grid(config, opts.quick), zoo.LADDER, runs_at, extend=not opts.quick)


def more_cells(ctx: Context) -> list[Cell]:
    """The runs each (configuration, rule) needs so far: the rates its search has screened past
    the starting grid and the rate it still has to screen or, once it has found a rate, its
    fresh seeds there, with BOS and with BOS denied. The study trains the ones not finished
    and asks again, until none is new."""
    opts, exe = ctx.opts, ctx.exe
    out: list[Cell] = []
    for config in zoo.CONFIGS:
        for rule in opts.rules:
            found = search(ctx, config, rule)
            # the rates screened past the starting grid (finished: counted, not trained again)
            # and the rate still to screen
            out += [zoo.screen_cell(opts, exe, config, rule, lr, s)
                    for lr in [*found.tried, *found.pending]
                    if lr not in zoo.start_grid(config, opts.quick) for s in zoo.screen_seeds(opts)]
            if found.best is None:
                continue
            lr = found.best
            out += [Cell(zoo.run_name("runs", config, rule, lr, s),
                         zoo.run_config(config, rule, lr, s, opts.quick, exe.device),
                         group=("zoo", config, rule), label=f"{config} {rule} fresh seeds")
                    for s in zoo.fresh_seeds(opts)]
            out += [Cell(zoo.run_name("denied", config, rule, lr, s, d),
                         zoo.run_config(config, rule, lr, s, opts.quick, exe.device, d),
                         group=("denied", config, rule, d.name),
                         label=f"{config} {rule} BOS {d.name}")
                    for d in zoo.denials(opts.quick) for s in zoo.fresh_seeds(opts)]
    return out


# ------------------------------------------------------------------- the pass over models


def model_checks(ctx: Context, name: str, capacity: bool) -> dict[str, Any]:
    """One pass over a trained model (cached in ``cache/``): validation MSE, the test errors
    with BOS hidden, the relative Gu rate with its row floor and, with ``capacity``, the error
    the capacity argument bounds (``sinklab.measure.zoo_checks``)."""
    path = ctx.out / name
    settings = {"version": CACHE_VERSION, "model": folders.model_digest(path),
                "validation_seed": VALIDATION_SEED, "gu_eps": GU_EPS, "floor": GU_ROW_FLOOR,
                "capacity": capacity, "capacity_sequences": CAPACITY_SEQUENCES}

    def compute() -> dict[str, Any]:
        return measure.zoo_checks(path, validation_seed=VALIDATION_SEED,
                                  capacity_sequences=CAPACITY_SEQUENCES if capacity else None,
                                  ablation_keys=ABLATION_KEYS, eps=GU_EPS, floor=GU_ROW_FLOOR)

    return ctx.cached(name.replace("runs/", "zoo_"), settings, compute)


def argument_error(ctx: Context, name: str, key: str) -> float:
    """A trained 1x1 model's largest error on the sequences of the argument ``key`` that has
    them (``POLE_GAP``'s, ``CLIP_OFFSET``'s, or "bos_denied" for a denied run a proof forces to
    err: ``sinklab.theory.capacity.model_argument_error``; cached)."""
    path = ctx.out / name
    settings = {"version": 1, "model": folders.model_digest(path), "argument": key}

    def compute() -> dict[str, Any]:
        return {"error": model_argument_error(path, key)}

    return ctx.cached(f"argument_{name.replace('/', '_')}", settings, compute)["error"]


# ------------------------------------------------------------------------------- records


def head_sources(summary: dict[str, Any], rule: str) -> list[list[str]]:
    """Where each head's zero comes from, [layer][head] (``sinklab.definitions.default_source``)."""
    kind = RULES[rule].row_kind
    return [[default_source(b, rn, rt, kind) for b, rn, rt in zip(bl, rnl, rtl)]
            for bl, rnl, rtl in zip(summary["bos_mass_nontrigger"],
                                    summary["row_sum_nontrigger"], summary["row_sum_trigger"])]


def bos_shares(summary: dict[str, Any]) -> list[list[float | None]]:
    """Each head's BOS share of its non-trigger rows (BOS weight / row sum), [layer][head];
    None where the rows sum to zero."""
    return [[b / rn if rn > 0 else None for b, rn in zip(bl, rnl)]
            for bl, rnl in zip(summary["bos_mass_nontrigger"], summary["row_sum_nontrigger"])]


def sinks(shares: list[list[float | None]], sources: list[list[str]]) -> bool:
    """Whether some head parks its non-trigger rows on BOS (the theorem's sink): its rows are
    on, at least half on BOS ("BOS" source), and at least ``SINK_SHARE`` of them on BOS.

    Judged by BOS's share of the row, so a gated head whose half-open gate scales a softmax on
    BOS sinks; an all-zero ReLU row does not."""
    return any(src == "BOS" and share is not None and share >= SINK_SHARE
               for sl, srcl in zip(shares, sources) for share, src in zip(sl, srcl))


def _largest(values: list[list[float | None]], keep: list[list[bool]]) -> float | None:
    chosen = [v for vl, kl in zip(values, keep) for v, k in zip(vl, kl) if k and v is not None]
    return max(chosen) if chosen else None


def run_record(ctx: Context, config: str, rule: str, lr: float, seed: int) -> dict[str, Any]:
    """One fresh run: its summary's numbers, where its zero comes from, the model checks."""
    name = zoo.run_name("runs", config, rule, lr, seed)
    s = in_shares(ctx.summary(name))  # a summary's rates are shares, an older one's percent
    argument = CAPACITY.get((config, rule))
    cfg = build_run_config(read_json(ctx.out / name / "config.json"))
    applies = argument is not None and capacity_applies(cfg, argument)
    checks = model_checks(ctx, name, applies and argument.measured)
    sources = head_sources(s, rule)
    shares = bos_shares(s)
    on = [[src in ON_SOURCES for src in layer] for layer in sources]
    gu = checks["gu"]
    return {
        "config": config, "rule": rule, "lr": lr, "seed": seed, "status": s["status"],
        "converged": s["converged"], "steps": s["steps"], "train_linf": s["train_linf"],
        "test_linf": s["linf_error"], "mse": s["mse"], "linf_trigger": s["linf_trigger"],
        "linf_nontrigger": s["linf_nontrigger"], "mse_trigger": s["mse_trigger"],
        "mse_nontrigger": s["mse_nontrigger"],
        "bos_mass_nontrigger": s["bos_mass_nontrigger"],  # absolute weight on BOS, per head
        "bos_share_nontrigger": shares,  # BOS's share of the row, per head
        "row_sum_nontrigger": s["row_sum_nontrigger"], "row_sum_trigger": s["row_sum_trigger"],
        "sources": sources, "sinks": sinks(shares, sources),
        "bos_weight_max": float(np.max(s["bos_mass_nontrigger"])),
        "bos_share_max_on": _largest(shares, on),
        # the zoo's records and report keep the sink rates in percent, as they always had them
        "sink_rate": 100 * s["sink_rate"],  # Gu et al., absolute, percent
        "sink_rate_relative": gu["rate"],  # relative, rows under the floor ignored, percent
        "sink_rate_relative_no_floor": 100 * s["sink_rate_relative"],
        "gu_rows_ignored": gu["rows_ignored"], "gu_rows_zero": gu["rows_zero"],
        "gu_rows": gu["rows"],
        "validation_mse": checks["validation_mse"],
        "ablated": checks["ablated"], "capacity_applies": applies,
        "capacity_mse": checks["capacity_mse"],
        "argument_error": argument_error(ctx, name, argument.key)
        if applies and argument in SEQUENCE_ARGUMENTS else None,
    }


def denied_floor(config: str, rule: str, denial: zoo.Denial, tol: float) -> float | None:
    """The error a proof forces on one layer of ``rule`` with BOS denied so, when it is above
    the stop rule's tolerance ``tol`` (``floors.denied_floor``: softmax, clipped softmax
    and uniform with BOS removed, softmax capped at eps >= 0.03), else None: such runs are a
    check of the proof, not evidence."""
    floor = floors.denied_floor(rule, denial.mode, denial.eps) if config == "1x1" else None
    return floor if floor is not None and floor > tol else None


def short_record(ctx: Context, name: str, denial: zoo.Denial | None = None,
                 **keys: Any) -> dict[str, Any]:
    """A screening or denied run: how it ended and its errors (and, for a denied run a proof
    forces to err, ``denied_floor``, its error on the argument's sequences)."""
    s = ctx.summary(name)
    cfg = build_run_config(read_json(ctx.out / name / "config.json"))
    floor = None
    if denial is not None and not RULES[keys["rule"]].non_default(cfg.model.attention_args):
        floor = denied_floor(keys["config"], keys["rule"], denial, cfg.train.tol)
    return {**keys, "forced": floor is not None, "floor": floor,
            "denied_error": argument_error(ctx, name, "bos_denied") if floor is not None
            else None,
            "status": s["status"], "converged": s["converged"], "steps": s["steps"],
            "train_linf": s["train_linf"], "test_linf": s["linf_error"],
            "linf_nontrigger": s["linf_nontrigger"], "linf_trigger": s["linf_trigger"],
            "bos_weight_max": float(np.max(s["bos_mass_nontrigger"])),
            "row_sum_nontrigger": float(np.mean(s["row_sum_nontrigger"]))}


def incidence(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps to the stop rule as cumulative incidence (``stats.cumulative_incidence``): the
    plateau and divergence compete with it, the cap censors."""
    causes = [None if r["status"] == "max_steps" else r["status"] for r in runs]
    curves = stats.cumulative_incidence([r["steps"] for r in runs], causes)
    return {"n": len(runs), "converged": curves.get("converged", []),
            "plateau": curves.get("plateau", []), "diverged": curves.get("diverged", []),
            "censored": sorted(r["steps"] for r in runs if r["status"] == "max_steps")}


def screen_record(config: str, rule: str, found: Search, steps_cap: int) -> dict[str, Any]:
    """One (configuration, rule)'s search: every screened rate with how its seeds ended."""
    rates = []
    for lr in sorted(found.tried):
        runs = found.tried[lr]
        _, med_steps, med_linf = rate_score(runs)
        rates.append({"lr": lr, "n": len(runs), "converged": sum(r["converged"] for r in runs),
                      "ends": count_ends(runs), "steps": [r["steps"] for r in runs],
                      "median_steps": med_steps if math.isfinite(med_steps) else None,
                      "median_train_linf": med_linf if math.isfinite(med_linf) else None})
    return {"config": config, "rule": rule, "rates": rates, "lr": found.best,
            "at_ladder_end": found.at_ladder_end, "cap": steps_cap,
            "extended": len(found.tried) > len(zoo.START[config])}


def entry(config: str, rule: str, chosen: list[dict[str, Any]], found: Search,
          denied: list[dict[str, Any]], opts: zoo.ZooOptions) -> dict[str, Any]:
    """One (configuration, rule): the rate found, its fresh seeds' numbers with BOS and how its
    denied runs ended."""
    n, converged = len(chosen), sum(r["converged"] for r in chosen)
    argument = CAPACITY.get((config, rule))
    applies = argument is not None and all(r["capacity_applies"] for r in chosen)
    capacity = argument if applies else None
    steps_cap = zoo.cap(config, opts.quick)
    ends = count_ends(chosen)
    solved = [r for r in chosen if r["converged"]]
    sources = [src for r in chosen for layer in r["sources"] for src in layer]
    counts = {src: sources.count(src) for src in SOURCES if src in sources}
    k_sink = sum(r["sinks"] for r in solved)
    kind = RULES[rule].row_kind

    def each(key: str) -> list[Any]:
        return [r[key] for r in chosen]

    by_setting = {}
    for d in zoo.denials(opts.quick):
        runs = [r for r in denied if r["setting"] == d.name]
        lost_ends = count_ends(runs)
        by_setting[d.name] = {
            "n": len(runs), "converged": sum(r["converged"] for r in runs), "ends": lost_ends,
            "outcome": outcome(lost_ends, len(runs), steps_cap, None),
            "test_linf": [r["test_linf"] for r in runs], "steps": [r["steps"] for r in runs],
            "forced": bool(runs) and all(r["forced"] for r in runs),
            "floor": runs[0]["floor"] if runs else None,
            "denied_error": [r["denied_error"] for r in runs],
            "incidence": incidence(runs)}
    implicit = RULES[rule].extra_key
    return {
        "config": config, "rule": rule, "row_kind": kind, "lr": found.best,
        "at_ladder_end": found.at_ladder_end, "n": n, "converged": converged, "cap": steps_cap,
        "ends": ends, "outcome": outcome(ends, n, steps_cap, capacity),
        "capacity": capacity.key if capacity else None,
        "capacity_why": capacity.why if capacity else None,
        "against_argument": bool(capacity and converged),
        "solves": 2 * converged >= n > 0,  # at least half its fresh seeds reach the stop rule
        "no_other_zero": no_other_zero(rule),
        "bos_sinks": k_sink, "n_solved": len(solved),
        "sinks_label": share_label(k_sink, len(solved)),
        "sources": counts, "n_heads": len(sources),
        "main_source": max(counts, key=lambda src: counts[src]) if counts else None,
        "seeds": each("seed"), "steps": each("steps"), "test_linf": each("test_linf"),
        "mse": each("mse"), "bos_weight_max": each("bos_weight_max"),
        "bos_share_max_on": each("bos_share_max_on"),
        "row_sum_nontrigger": [float(np.mean(r["row_sum_nontrigger"])) for r in chosen],
        "row_sum_trigger": [float(np.mean(r["row_sum_trigger"])) for r in chosen],
        # the weight an implicit or learned sink key holds at non-trigger rows: its own source
        "sink_key_mass": [1 - float(np.mean(r["row_sum_nontrigger"])) for r in chosen]
        if implicit else None,
        "sink_rate": each("sink_rate"), "sink_rate_relative": each("sink_rate_relative"),
        "gu_rows_ignored": sum(each("gu_rows_ignored")), "gu_rows_zero": sum(each("gu_rows_zero")),
        "gu_rows": sum(each("gu_rows")), "capacity_mse": each("capacity_mse"),
        "argument_error": each("argument_error"),
        "ablation": {key: {"intact": each(key), "ablated": [r["ablated"][key] for r in chosen]}
                     for key in ABLATION_KEYS},
        "incidence": incidence(chosen), "denied": by_setting,
    }


def protocol(opts: zoo.ZooOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from the runs' own configs."""
    cfg = zoo.run_config("1x1", "softmax", zoo.START["1x1"][1], 0, opts.quick, exe.device)
    return {"beta1": cfg.train.beta1, "beta2": cfg.train.beta2,
            "batch_size": cfg.train.batch_size, "tol": cfg.train.tol,
            "cap": {c: zoo.cap(c, opts.quick) for c in zoo.CONFIGS}, "patience": cfg.train.patience,
            "start": {c: list(zoo.start_grid(c, opts.quick)) for c in zoo.CONFIGS},
            "ladder": list(zoo.LADDER), "screen_seeds": list(zoo.screen_seeds(opts)),
            "fresh_seeds": list(zoo.fresh_seeds(opts)),
            "denials": [d.name for d in zoo.denials(opts.quick)],
            "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
            "validation_seed": VALIDATION_SEED, "seq_len": cfg.task.seq_len,
            "d_model": cfg.task.d_model, "train_trigger_min": cfg.task.train_trigger_min,
            "train_trigger_max": cfg.task.train_trigger_max, "sink_share": SINK_SHARE,
            "gu_row_floor": GU_ROW_FLOOR, "log_every": zoo.LOG_EVERY,
            "paper_cap": build_run_config({}).train.max_steps}


def expressivity(ctx: Context, config: str, rule: str) -> dict[str, Any]:
    """What the rule can express in ``config`` (``sinklab.theory.expressivity.EXPRESSIVITY``):
    the verdict, on what grounds, and for a construction its measured worst error (cached)."""
    verdict = ex.EXPRESSIVITY.get((config, rule))
    if verdict is None:
        return {"config": config, "rule": rule, "verdict": "unknown", "how": "open",
                "construction": None, "why": "not in sinklab's table (a rule of a plugin)",
                "check": None}
    check = None
    if verdict.construction is not None:
        check = ctx.cached(f"expressivity_{config}_{rule}",
                           {"version": 1, "config": config, "rule": rule, "how": verdict.how},
                           lambda: ex.check_construction(config, rule))
    return {"config": config, "rule": rule, "verdict": verdict.verdict, "how": verdict.how,
            "construction": verdict.construction, "why": verdict.why, "check": check}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs, denied, screens, entries = [], [], [], []
    for config in zoo.CONFIGS:
        for rule in opts.rules:
            found = search(ctx, config, rule)
            lr = found.best
            screens.append(screen_record(config, rule, found, zoo.cap(config, opts.quick)))
            chosen = [run_record(ctx, config, rule, lr, s) for s in zoo.fresh_seeds(opts)]
            lost = [short_record(ctx, zoo.run_name("denied", config, rule, lr, s, d), d,
                                 config=config, rule=rule, setting=d.name, lr=lr, seed=s)
                    for d in zoo.denials(opts.quick) for s in zoo.fresh_seeds(opts)]
            runs += chosen
            denied += lost
            entries.append(entry(config, rule, chosen, found, lost, opts))
    capacity = None
    if any(e["capacity"] for e in entries):
        capacity = capacity_bounds(zoo.run_config("1x1", "softmax", zoo.START["1x1"][1], 0,
                                                  opts.quick, ctx.exe.device))
    return {"protocol": protocol(opts, ctx.exe), "runs": runs, "entries": entries,
            "screen": screens, "denied": denied, "capacity": capacity,
            "expressivity": [expressivity(ctx, config, rule) for config in zoo.CONFIGS
                             for rule in opts.rules],
            "capacity_table": [{"config": c, "rule": r, "argument": a.key, "why": a.why,
                                "measured": a.measured} for (c, r), a in CAPACITY.items()]}


# ------------------------------------------------------------------------------- figures


def _sel(records: dict[str, Any], config: str) -> list[dict[str, Any]]:
    return [e for e in records["entries"] if e["config"] == config]


def _draw_sources(axes: Any, records: dict[str, Any], opts: zoo.ZooOptions) -> None:
    for ax, config in zip(axes[0], zoo.CONFIGS):
        sel = _sel(records, config)
        xs = np.arange(len(sel))
        bottom = np.zeros(len(sel))
        for source in SOURCES:
            share = np.array([e["sources"].get(source, 0) / max(e["n_heads"], 1) for e in sel])
            ax.bar(xs, share, bottom=bottom, label=source)
            bottom += share
        for x, e in zip(xs, sel):
            ax.annotate(f"{e['converged']}/{e['n']}", (x, 1.02), ha="center", fontsize=7)
        ax.set_xticks(xs, [e["rule"] for e in sel], rotation=45, ha="right")
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of heads (fresh seeds at the rate found)")
        ax.set_title(f"{config}: where \"output zero\" comes from (seeds that reached the "
                     "stop rule on top)", fontsize=9)
        ax.legend(fontsize=7)


def _draw_bos(axes: Any, records: dict[str, Any], opts: zoo.ZooOptions) -> None:
    for ax, config in zip(axes[0], zoo.CONFIGS):
        sel = _sel(records, config)
        for x, e in enumerate(sel):
            ax.scatter([x] * e["n"], e["bos_weight_max"], color="tab:blue", s=14,
                       label="BOS weight (absolute), most-BOS head" if x == 0 else None)
            shares = [v for v in e["bos_share_max_on"] if v is not None]
            ax.scatter([x + 0.2] * len(shares), shares, color="tab:green", marker="^", s=14,
                       label="BOS share of the row, most-BOS head that is on"
                       if x == 0 else None)
            ax.scatter([x] * e["n"], np.clip(e["test_linf"], 0, 1), color="tab:red",
                       marker="x", s=14, label="test L∞ (clipped at 1)" if x == 0 else None)
        ax.axhline(SINK_SHARE, color="grey", ls="--", lw=0.8)
        ax.set_xticks(range(len(sel)), [e["rule"] for e in sel], rotation=45, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{config}: per fresh seed, at the rate found", fontsize=9)
        ax.legend(fontsize=7)


def _draw_incidence(axes: Any, records: dict[str, Any], opts: zoo.ZooOptions) -> None:
    """Cumulative incidence of the stop rule (solid) and of the plateau (dotted) per rule,
    fresh seeds with BOS (top) and with BOS removed (bottom), 1x1 left and 2x2 right."""
    colours = plt.get_cmap("tab20")
    rules = list(dict.fromkeys(e["rule"] for e in records["entries"]))
    for row, setting in enumerate((None, zoo.REMOVED.name)):
        for ax, config in zip(axes[row], zoo.CONFIGS):
            for e in _sel(records, config):
                inc = e["incidence"] if setting is None else e["denied"].get(setting, {}).get(
                    "incidence")
                if not inc:
                    continue
                colour = colours(rules.index(e["rule"]) % 20)
                for key, style in (("converged", "-"), ("plateau", ":")):
                    points = inc[key]
                    if points:
                        xs = [0, *[t for t, _ in points], e["cap"]]
                        ys = [0, *[f for _, f in points], points[-1][1]]
                        ax.step(xs, ys, where="post", ls=style, color=colour, lw=1.2,
                                label=e["rule"] if key == "converged" else None)
            ax.set_xscale("symlog", linthresh=100)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.set_ylabel("share of seeds")
            where = "BOS visible" if setting is None else f"BOS {setting}"
            ax.set_title(f"{config}, {where}: reached (solid), plateau (dotted)", fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, ncol=2)


def _draw_screen(axes: Any, records: dict[str, Any], opts: zoo.ZooOptions) -> None:
    """The search's every screened rate: the share of its screening seeds that reached the stop
    rule, per rule, with the rate found marked."""
    for ax, config in zip(axes[0], zoo.CONFIGS):
        screens = [s for s in records["screen"] if s["config"] == config]
        for i, sc in enumerate(screens):
            lrs = [r["lr"] for r in sc["rates"]]
            shares = [r["converged"] / r["n"] for r in sc["rates"]]
            offset = 0.02 * (i - len(screens) / 2)  # rules apart where their shares coincide
            line, = ax.plot(lrs, [v + offset for v in shares], marker="o", ms=3, lw=1,
                            label=sc["rule"])
            found = next(r for r in sc["rates"] if r["lr"] == sc["lr"])
            ax.plot([sc["lr"]], [found["converged"] / found["n"] + offset], marker="*", ms=10,
                    color=line.get_color())
        ax.set_xscale("log")
        ax.set_ylim(-0.15, 1.15)
        ax.set_xlabel("learning rate")
        ax.set_ylabel("share of screening seeds that reached the stop rule")
        ax.set_title(f"{config}: the search (star: the rate found)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)


FIGURES = (
    FigureSpec("fig_zoo_sources", _draw_sources, grid=(1, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_bos", _draw_bos, grid=(1, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_incidence", _draw_incidence, grid=(2, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_search", _draw_screen, grid=(1, 2), size=(6.0, 4.2)),
)


complete = relabel  # the name the runner reads it by
