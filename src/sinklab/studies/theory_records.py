"""The theory study's records, built from its folders: what ``theory_analysis.collect`` returns.

The denied-sink runs and their settings, the reproduction's runs (from --reproduce or trained
here) with their error-BOS frontier and what the heads of the 4x4 softmax models write, the
worst-case sections (the measurements of ``sinklab.theory.bounds`` on the frontier runs, the
sink family and the denied-sink runs, kept in the study's cache) and the plain-target stacks
(``sinklab.theory.stacks``, with their protocol search); the tables the report reads from them.
Functions taking the study's ``Context`` read its folder (``ctx.out``) and its summaries.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab import stats
from sinklab.config import EXPERIMENTS, RunConfig, build_run_config
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ResultsError
from sinklab.model import AttentionStack
from sinklab.runs import folders
from sinklab.runs.files import read_log
from sinklab.studies import reproduce
from sinklab.studies.outputs import read_records
from sinklab.studies.study import Context, Execution
from sinklab.studies.theory import (
    ATTACK_RESTARTS,
    CANCEL_SHARE,
    CHECKPOINT_ATTACK_STEPS,
    CONSTANT_SHARE,
    DENIED_RESTARTS,
    FACTOR,
    FAMILY_SLOPE,
    FAMILY_SLOPE_TOL,
    FRONTIER_LOW,
    FRONTIER_MIN_RANGE,
    HEAD_FIGURE_SEEDS,
    IDENTITY_REL,
    PLAIN_ATTACK_RESTARTS,
    PLAIN_SEQUENCES,
    QUICK_WORST_GAPS,
    RELU_BOUND,
    RELU_SIZES,
    RULES,
    STRONGER,
    UNDERSTATES,
    WORST_GAPS,
    TheoryOptions,
    denied_name,
)
from sinklab.theory import bounds, certify
from sinklab.theory import constructions as theory
from sinklab.theory.attack import attack
from sinklab.theory.bounds import (
    CHECKPOINT_RESTARTS,
    ROUNDING,
    SAMPLED,
    denied_floor,
    frontier_name,
    upper,
    worst_case,
)
from sinklab.theory.protocol import (
    ERROR_BINS,
    PLAIN_EXPERIMENTS,
    PLAIN_FIRST_SEED,
    PLAIN_GRID_LR,
    PLAIN_GRID_STD,
    PLAIN_GRID_STEPS,
    PLAIN_PROTOCOL,
    PLAIN_RULES,
    grid_runs,
)
from sinklab.theory.stacks import grid_name, plain_config, plain_measure, plain_name
from sinklab.train import (
    build_ensemble,
    list_checkpoints,
    load_checkpoint,
    load_model,
    plateau_rule_text,
)

# How a run can end (``sinklab.train``): the stop rule, the plateau rule, the step cap, NaN.
STOPS = ("converged", "plateau", "max_steps", "diverged")


# ------------------------------------------------------- denied sinks, frontier, heads


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r[key] is not None and np.isfinite(r[key])]


def denied_records(ctx: Context) -> list[dict[str, Any]]:
    """One row per denied-sink run: reached the stop rule?, its best training-batch errors
    over the logged checkpoints, its test errors and BOS mass."""
    rows = []
    for rule in RULES:
        for setting, eps in theory.denied_settings(ctx.opts.eps):
            for seed in range(ctx.opts.seeds):
                name = denied_name(rule, setting, seed)
                summary = ctx.summary(name)
                best = theory.floor(read_log(ctx.out / name / "metrics.jsonl"))
                rows.append({
                    "rule": rule, "setting": setting, "eps": eps, "seed": seed,
                    "converged": summary["converged"], "status": summary["status"],
                    "steps": summary["steps"], "best_train_linf": best["best_linf"],
                    "best_train_mse": best["best_mse"], "test_linf": summary["linf_error"],
                    "test_mse": summary["mse"],
                    "bos_mass_nontrigger": summary["bos_mass_nontrigger"][0][0],
                })
    return rows


def denied_settings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rule and setting, over seeds: how many reached the stop rule, and the errors."""
    out = []
    for rule in RULES:
        for setting in dict.fromkeys(r["setting"] for r in rows):
            sel = [r for r in rows if r["rule"] == rule and r["setting"] == setting]
            best = _values(sel, "best_train_linf")
            eps = sel[0]["eps"]
            out.append({
                "rule": rule, "setting": setting, "eps": eps, "n": len(sel),
                "converged": sum(r["converged"] for r in sel),
                "best_train_linf": best, "best_train_mse": _values(sel, "best_train_mse"),
                "best_over_eps": [b / eps for b in best] if eps else None,
                "test_linf": _values(sel, "test_linf"),
                "bos_mass_nontrigger": _values(sel, "bos_mass_nontrigger"),
            })
    return out


def check_reproduce(rdir: Path) -> dict[str, Any]:
    """The records of ``rdir``, a finished reproduce folder that no process is writing, whose
    every run has finished; one sentence (ResultsError) otherwise. Reads only."""
    rdir = Path(rdir)
    hint = f"run `sinklab reproduce --out {rdir}` first, or leave out --reproduce"
    if not rdir.exists():
        raise ResultsError(f"--reproduce {rdir} is not a finished reproduce folder: it does not "
                           f"exist ({hint}).")
    if not rdir.is_dir():
        raise ResultsError(f"--reproduce {rdir} is a file, not a reproduce folder.")
    if folders.kind_of(rdir) != "reproduce":
        raise ResultsError(f"--reproduce {rdir} is not a sinklab reproduce folder (its "
                           f"{folders.MARKER} does not say so).")
    if (holder := folders.writer(rdir)) is not None:
        raise ResultsError(f"--reproduce {rdir} is being written by {holder}; wait for it to "
                           "finish, then run this command again.")
    result = read_records(rdir, "reproduce")
    for run in result["records"]["runs"]:
        path = rdir / reproduce.run_name(run["experiment"], run["rule"], run["seed"])
        if not folders.check_complete(path):
            raise ResultsError(f"{path} has not finished; run `sinklab reproduce --out {rdir}` "
                               "again to finish it.")
    return result


def reproduction_runs(ctx: Context) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Where the reproduction's runs are, which runs (experiment, rule, seed, converged) and
    what it was run with (seeds, quick, and the --reproduce folder or None)."""
    opts = ctx.opts
    if opts.reproduce is not None:
        result = check_reproduce(opts.reproduce)  # again: it may have changed meanwhile
        runs = [{k: r[k] for k in ("experiment", "rule", "seed", "converged")}
                for r in result["records"]["runs"]]
        return Path(opts.reproduce), runs, {
            "folder": str(opts.reproduce), "seeds": result["options"]["seeds"],
            "quick": result["options"]["quick"], "command": result["meta"]["command"]}
    runs = []
    for e in EXPERIMENTS:
        for r in reproduce.RULES:
            for s in range(opts.seeds):
                summary = ctx.summary(reproduce.run_name(e, r, s))
                runs.append({"experiment": e, "rule": r, "seed": s,
                             "converged": summary["converged"]})
    return ctx.out, runs, {"folder": None, "seeds": opts.seeds, "quick": opts.quick,
                           "command": None}


def _low_error(points: list[dict[str, float]]) -> list[dict[str, float]]:
    return [p for p in points if p["train_linf"] < FRONTIER_LOW]


def frontier_records(rdir: Path, runs: list[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every logged checkpoint of every reproduction run as (training-batch L∞, min and max
    non-trigger BOS mass over heads), and per (experiment, rule) their summary."""
    per_run = []
    for run in runs:
        path = rdir / reproduce.run_name(run["experiment"], run["rule"], run["seed"])
        points = theory.frontier_points(read_log(path / "metrics.jsonl"))
        low = _low_error(points)
        per_run.append({**run, "points": points, "n_low": len(low),
                        "n_low_sink": sum(p["bos_max"] >= SINK_HEAD_THRESHOLD for p in low)})
    groups = []
    for e in EXPERIMENTS:
        for rule in reproduce.RULES:
            sel = [r for r in per_run if r["experiment"] == e and r["rule"] == rule]
            if not sel:
                continue
            every = [p for r in sel for p in r["points"]]
            low = _low_error(every)
            groups.append({
                "experiment": e, "rule": rule, "n_runs": len(sel),
                **theory.frontier_summary(every, min_bos_range=FRONTIER_MIN_RANGE),
                "n_low": len(low),
                "low_bos_max_min": min((p["bos_max"] for p in low), default=None),
                "low_bos_max_max": max((p["bos_max"] for p in low), default=None),
            })
    return per_run, groups


def head_records(rdir: Path, runs: list[dict[str, Any]], n_sequences: int
                 ) -> list[dict[str, Any]]:
    """What every head of every 4x4 softmax reproduction model writes at non-trigger rows,
    split into its constant and its variation (``theory.head_split``)."""
    found = []
    for run in runs:
        if run["experiment"] != "4x4" or run["rule"] != "softmax":
            continue
        cfg, model = load_model(rdir / reproduce.run_name("4x4", "softmax", run["seed"]))
        batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
        found.append({"seed": run["seed"], "converged": run["converged"],
                      **theory.head_split(model, batch)})
    return found


def constant_share(entry: dict[str, Any]) -> float:
    """The share of the summed squares of a model's head outputs that is their constant part:
    sum of const^2 over every head / sum of rms^2."""
    heads = [h for layer in entry["layers"] for h in layer["heads"]]
    total = sum(h["rms"] ** 2 for h in heads)
    return sum(h["const"] ** 2 for h in heads) / total if total > 0 else float("nan")


def excursion(entry: dict[str, Any]) -> float:
    """How far the layers move the stream at non-trigger rows: the largest RMS, over layers,
    of what layers 1..l have added."""
    return max(layer["cumulative"]["rms"] for layer in entry["layers"])


def head_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (seed, layer, head): every head of every seed, as measured."""
    return [{"seed": e["seed"], "converged": e["converged"], "layer": li + 1, "head": hi + 1,
             **h} for e in entries for li, layer in enumerate(e["layers"])
            for hi, h in enumerate(layer["heads"])]


def head_layers(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer, over seeds, statistics that do not depend on head order (heads are
    interchangeable between seeds): sink heads per seed, the heads' summed squares and their
    constant share, the split of sink and other heads pooled, of the layer's sum and of the
    stream so far; each as mean, smallest and largest over seeds (or over the pooled heads)."""
    if not entries:
        return []
    out = []
    for li in range(len(entries[0]["layers"])):
        layers = [e["layers"][li] for e in entries]
        heads = [h for layer in layers for h in layer["heads"]]
        sinks = [h for h in heads if h["bos_mass_nontrigger"] >= SINK_HEAD_THRESHOLD]
        others = [h for h in heads if h["bos_mass_nontrigger"] < SINK_HEAD_THRESHOLD]
        counts = [sum(h["bos_mass_nontrigger"] >= SINK_HEAD_THRESHOLD for h in layer["heads"])
                  for layer in layers]
        out.append({
            "layer": li + 1, "n": len(layers),
            "sink_heads_distribution": {str(k): v for k, v in sorted(Counter(counts).items())},
            "head_rms": stats.mean_and_range([h["rms"] for h in heads]),
            "sink_const": stats.mean_and_range([h["const"] for h in sinks]),
            "sink_var": stats.mean_and_range([h["var"] for h in sinks]),
            "other_const": stats.mean_and_range([h["const"] for h in others]),
            "other_var": stats.mean_and_range([h["var"] for h in others]),
            "n_sink": len(sinks), "n_other": len(others),
            "layer_const": stats.mean_and_range([layer["layer"]["const"] for layer in layers]),
            "layer_var": stats.mean_and_range([layer["layer"]["var"] for layer in layers]),
            "cumulative_const": stats.mean_and_range([layer["cumulative"]["const"]
                                                      for layer in layers]),
            "cumulative_var": stats.mean_and_range([layer["cumulative"]["var"]
                                                    for layer in layers]),
        })
    return out


def protocol(opts: TheoryOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from a denied-sink run's own config."""
    cfg = theory.denied_config("softmax", "removed", None, 0, opts.steps, exe.device)
    return {"tol": cfg.train.tol, "lr": cfg.train.lr, "beta1": cfg.train.beta1,
            "beta2": cfg.train.beta2, "batch_size": cfg.train.batch_size,
            "denied_steps": opts.steps, "log_every": cfg.train.log_every,
            "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
            "seq_len": cfg.task.seq_len, "d_model": cfg.task.d_model,
            "train_trigger_min": cfg.task.train_trigger_min,
            "train_trigger_max": cfg.task.train_trigger_max,
            "seeds": opts.seeds, "eps": list(opts.eps), "quick": opts.quick,
            "patience": cfg.train.patience, "plateau_rule": plateau_rule_text(cfg.train.patience),
            "save_every": opts.save_every,
            "relu_sizes": [list(s) for s in dict.fromkeys(
                [*RELU_SIZES, (opts.seq_len, opts.d_model)])]}


def thresholds() -> dict[str, Any]:
    return {"relu_bound": RELU_BOUND, "family_slope": FAMILY_SLOPE,
            "family_slope_tol": FAMILY_SLOPE_TOL, "frontier_low": FRONTIER_LOW,
            "frontier_min_range": FRONTIER_MIN_RANGE, "constant_share": CONSTANT_SHARE,
            "cancel_share": CANCEL_SHARE, "identity_rel": IDENTITY_REL,
            "sink_head": SINK_HEAD_THRESHOLD, "head_figure_seeds": HEAD_FIGURE_SEEDS,
            "error_bins": [[lo, None if hi == float("inf") else hi]
                           for lo, hi in ERROR_BINS]}


# ------------------------------------------------------------ worst case and necessity


def worst_table(finals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (rule, row type): sampled, attacked and certified suprema over positions,
    as mean, smallest and largest over seeds (certified trigger rows where the records have
    them)."""
    rows = []
    for rule in RULES:
        sel = [f for f in finals if f["rule"] == rule]
        for kind in ("pre", "post", "trigger", "bos"):
            sampled = [max(stats.finite(f["sampled"][kind]), default=float("nan")) for f in sel]
            attacked = [max(stats.finite(f["attacked"][kind]), default=float("nan")) for f in sel]
            cert = []
            for f in sel:
                c = f.get("certified")
                if c is None or (kind == "trigger" and "trigger_rows" not in c):
                    continue
                rows_of = c["trigger_rows"] if kind == "trigger" else \
                    [r for r in c["rows"] if r["kind"] == kind]
                cert.append(c["bos"] if kind == "bos" else
                            max(upper(r["upper"]) for r in rows_of))
            rows.append({"rule": rule, "kind": kind, "n": len(sel),
                         "sampled": stats.mean_and_range(sampled),
                         "attacked": stats.mean_and_range(attacked),
                         "certified": certified_spread(cert) if cert else None})
    return rows


def certified_spread(values: list[float]) -> dict[str, float | None]:
    """``spread`` of certified upper bounds, where an unknown (infinite) bound of any seed
    makes the mean and the largest unknown too, instead of leaving that seed out."""
    out = stats.mean_and_range(values)
    if any(v == math.inf for v in values):
        out.update(mean=math.inf, max=math.inf)
    return out


def checkpoint_records(ctx: Context, seeds: int, steps: int) -> list[dict[str, Any]]:
    """Every saved checkpoint of every frontier run: the cheap attack (trigger at L - 1: every
    pre row and that trigger row), the norm and the rule's evidence (necessity for softmax,
    the largest non-trigger score for ReLU)."""
    out = []
    for rule in RULES:
        for seed in range(seeds):
            folder = ctx.out / frontier_name(rule, seed)
            for step in list_checkpoints(folder):
                cfg, model = load_checkpoint(folder, step)
                L = cfg.task.seq_len
                rec = worst_case(model, cfg, steps=steps, restarts=CHECKPOINT_RESTARTS,
                                 seconds=0.0, triggers=[L - 1], certified=False,
                                 name=f"{folder} at step {step}")
                entry = {"rule": rule, "seed": seed, "step": step, "norm": rec["norm"],
                         "pre": stats.finite(rec["attacked"]["pre"]),
                         "trigger": rec["attacked"]["trigger"][L - 1],
                         "bos": rec["attacked"]["bos"][0]}
                if rule == "softmax":  # bound_check reads these (``with_checks``)
                    entry["attacked"], entry["necessity"] = rec["attacked"], rec["necessity"]
                else:
                    score = rec["relu_score"]
                    entry["max_score"] = score["max"]
                    entry["certified_zero"] = score["certified_zero"]
                out.append(entry)
    return out


def final_records(ctx: Context, seeds: int, steps: int, restarts: int, seconds: float
                  ) -> list[dict[str, Any]]:
    """The final model of every frontier run: sampled, attacked and certified errors."""
    out = []
    for rule in RULES:
        for seed in range(seeds):
            name = frontier_name(rule, seed)
            cfg, model = load_model(ctx.out / name)
            summary = ctx.summary(name)
            rec = worst_case(model, cfg, steps=steps, restarts=restarts, seconds=seconds,
                             name=str(ctx.out / name))
            out.append({"rule": rule, "seed": seed, "steps": summary["steps"],
                        "converged": summary["converged"], **rec})
    return out


def denied_worst(ctx: Context, names: list[tuple[str, str, float | None, int, str]],
                 steps: int, restarts: int) -> list[dict[str, Any]]:
    """Per denied-sink run (rule, setting, eps, seed, folder name): the arithmetic floor at
    row 1, and the errors at row 1 (the larger of the attack's and the floor's input's), at the
    other non-trigger rows and at trigger rows (the attack's)."""
    out = []
    for rule, setting, eps, seed, name in names:
        cfg, model = load_model(ctx.out / name)
        floor = denied_floor(model, cfg)
        worst = attack(model, cfg, steps=steps, restarts=restarts, per_coordinate=False)
        err = worst.to_dict("none")["error"]
        row1 = max(stats.finite([err["pre"][1], floor["at_witness"]]), default=float("nan"))
        others = stats.finite(err["bos"] + err["pre"][2:] + err["post"])
        out.append({"rule": rule, "setting": setting, "eps": eps, "seed": seed, **floor,
                    "row1": row1, "others": max(others, default=float("nan")),
                    "trigger": max(stats.finite(err["trigger"]), default=float("nan"))})
    return out


def worst_records(ctx: Context) -> dict[str, Any]:
    """The worst-case sections (``studies.bounds``): each heavy part kept in the study's cache
    under the settings it depends on."""
    opts = ctx.opts
    base = {"seeds": opts.seeds, "save_every": opts.save_every,
            "attack_steps": opts.attack_steps, "certify_seconds": opts.certify_seconds,
            "quick": opts.quick}
    ctx.log("theory: worst-case errors of the 1x1 models (attack and certificate)")
    finals = ctx.cached("worst_finals", {**base, "restarts": ATTACK_RESTARTS,
                                         "witnesses": True}, lambda: {
        "rows": final_records(ctx, opts.seeds, opts.attack_steps, ATTACK_RESTARTS,
                                     opts.certify_seconds)})["rows"]
    ctx.log("theory: the necessity bound at every saved checkpoint")
    checkpoints = ctx.cached("worst_checkpoints", {**base, "steps": CHECKPOINT_ATTACK_STEPS},
                             lambda: {"rows": checkpoint_records(
                                 ctx, opts.seeds, CHECKPOINT_ATTACK_STEPS)})["rows"]
    gaps = list(QUICK_WORST_GAPS if opts.quick else WORST_GAPS)
    family = ctx.cached("worst_family", {"gaps": gaps, "seq_len": opts.seq_len,
                                         "d_model": opts.d_model,
                                         "attack_steps": opts.attack_steps,
                                         "certify_seconds": opts.certify_seconds},
                        lambda: {"rows": bounds.family_records(
                            gaps, opts.seq_len, opts.d_model, opts.attack_steps,
                            opts.certify_seconds)})["rows"]
    construction = bounds.construction_record(opts.seq_len, opts.d_model, opts.certify_seconds)
    ctx.log("theory: worst-case errors of the denied-sink runs")
    names = [(rule, setting, eps, seed, denied_name(rule, setting, seed))
             for rule in RULES for setting, eps in theory.denied_settings(opts.eps)
             for seed in range(opts.seeds)]
    denied = ctx.cached("worst_denied", {**base, "eps": list(opts.eps), "steps": opts.steps},
                        lambda: {"rows": denied_worst(ctx, names, opts.attack_steps,
                                                             DENIED_RESTARTS)})["rows"]
    checkpoints, family = bounds.with_checks(checkpoints), bounds.with_checks(family)
    finals = bounds.with_checks(finals)
    return {"finals": finals, "checkpoints": checkpoints, "family": family,
            "construction": construction, "denied": denied,
            "table": worst_table(finals),
            "settings": {**base, "restarts": ATTACK_RESTARTS, "denied_restarts": DENIED_RESTARTS,
                         "checkpoint_restarts": CHECKPOINT_RESTARTS,
                         "checkpoint_attack_steps": CHECKPOINT_ATTACK_STEPS,
                         "sampled": SAMPLED, "factor": FACTOR,
                         "understates": UNDERSTATES, "stronger": STRONGER,
                         "rounding": ROUNDING,
                         "rtol": certify.RTOL, "margin": certify.MARGIN}}


# ------------------------------------------------------------------------ plain stacks


def _known(flags: list[bool | None]) -> list[bool]:
    return [f for f in flags if f is not None]


def all_covered(run: dict[str, Any]) -> bool:
    """Whether every non-trigger query position of the run has a sinking head somewhere."""
    return all(_known(run["positions_covered"]))


def by_config(runs: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(experiment, rule, its runs) for every configuration that has runs, in order."""
    out = []
    for e in PLAIN_EXPERIMENTS:
        for rule in PLAIN_RULES:
            sel = [r for r in runs if r["experiment"] == e and r["rule"] == rule]
            if sel:
                out.append((e, rule, sel))
    return out


def grid_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The protocol search per (shape, rule, init_std, lr), over its seeds: how many reached the
    stop rule, the median steps of those that did (None if none did), and the median best
    training-batch L∞. ``rows`` are one per grid run (``grid_records``)."""
    points: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        points.setdefault((r["experiment"], r["rule"], r["init_std"], r["lr"]), []).append(r)
    out = []
    for (e, rule, std, lr), sel in points.items():
        conv = [r["steps"] for r in sel if r["converged"]]
        out.append({
            "experiment": e, "rule": rule, "init_std": std, "lr": lr, "n": len(sel),
            "converged": len(conv), "diverged": sum(r["status"] == "diverged" for r in sel),
            "steps_median": float(np.median(conv)) if conv else None,
            "best_linf_median": stats.finite_median([r["best_train_linf"] for r in sel]),
        })
    return out


def _choice_key(p: dict[str, Any]) -> tuple[float, float, float]:
    """plain_choice's order: most seeds at the stop rule, then fewest median steps to it, then
    the lowest median best training-batch L∞."""
    inf = math.inf
    return (-p["converged"], inf if p["steps_median"] is None else p["steps_median"],
            inf if p["best_linf_median"] is None else p["best_linf_median"])


PLAIN_CHOICE_RULE = ("the grid point with the most search seeds at the stop rule; among those, "
                     "the fewest median steps to it; then the lowest median best training-batch "
                     "L∞")


def plain_choice(points: list[dict[str, Any]], stds: tuple[float, ...] = PLAIN_GRID_STD,
                 lrs: tuple[float, ...] = PLAIN_GRID_LR) -> list[dict[str, Any]]:
    """Per (shape, rule) the grid point ``PLAIN_CHOICE_RULE`` picks, whether it is the declared
    protocol (``PLAIN_PROTOCOL``), and whether it is bracketed: for each of init_std and lr,
    whether the grid has a value on both sides of the chosen one (at an edge the best value may
    lie outside the grid)."""
    out = []
    for e in PLAIN_EXPERIMENTS:
        for rule in PLAIN_RULES:
            sel = [p for p in points if p["experiment"] == e and p["rule"] == rule]
            if not sel:
                continue
            best = min(sel, key=_choice_key)
            declared = PLAIN_PROTOCOL[(e, rule)]
            out.append({
                "experiment": e, "rule": rule, "init_std": best["init_std"], "lr": best["lr"],
                "converged": best["converged"], "n": best["n"],
                "declared": list(declared),
                "is_declared": (best["init_std"], best["lr"]) == declared,
                "std_bracketed": min(stds) < best["init_std"] < max(stds),
                "lr_bracketed": min(lrs) < best["lr"] < max(lrs),
            })
    return out


def plain_groups(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (experiment, rule), over seeds: how the runs stopped (not a claim: a count), their
    steps and errors, and how many have a sink head (with its 95% Clopper-Pearson interval)."""
    out = []
    for e, rule, sel in by_config(runs):
        steps = [r["steps"] for r in sel]
        with_sink = sum(bool(r["sink_heads"]) for r in sel)
        out.append({
            "experiment": e, "rule": rule, "n": len(sel),
            **{stop: sum(r["status"] == stop for r in sel) for stop in STOPS},
            "steps_min": min(steps), "steps_max": max(steps),
            "best_train_linf": stats.finite([r["best_train_linf"] for r in sel]),
            "test_linf": stats.finite([r["test_linf"] for r in sel]),
            "with_sink": with_sink,
            "with_sink_interval": list(stats.clopper_pearson(with_sink, len(sel))),
            "all_covered": sum(all_covered(r) for r in sel),
        })
    return out


def plain_protocol(seeds: int, max_steps: int) -> dict[str, Any]:
    """The settings the report quotes, read from a run's own config: the step cap, the plateau
    rule (its patience, and in words ``sinklab.train.plateau_rule_text``), the stop rule, the
    sink threshold, and the initial weight scale and learning rate of each shape and rule."""
    cfgs = {(e, rule): plain_config(e, rule, 0, max_steps)
            for e in PLAIN_EXPERIMENTS for rule in PLAIN_RULES}
    cfg = next(iter(cfgs.values()))
    return {
        "experiments": list(PLAIN_EXPERIMENTS), "rules": list(PLAIN_RULES), "seeds": seeds,
        "max_steps": cfg.train.max_steps, "patience": cfg.train.patience,
        "plateau_rule": plateau_rule_text(cfg.train.patience, cfg.train.lr_drops,
                                          cfg.train.lr_drop_factor),
        "lr_drops": cfg.train.lr_drops, "lr_drop_factor": cfg.train.lr_drop_factor,
        "grid_max_steps": min(max_steps, PLAIN_GRID_STEPS),
        "grid_plateau_rule": plateau_rule_text(cfg.train.patience),
        "tol": cfg.train.tol, "batch_size": cfg.train.batch_size,
        "beta1": cfg.train.beta1, "beta2": cfg.train.beta2, "log_every": cfg.train.log_every,
        "protocol": [{"experiment": e, "rule": rule, "init_std": c.model.init_std,
                      "lr": c.train.lr} for (e, rule), c in cfgs.items()],
        "first_seed": PLAIN_FIRST_SEED, "paper_init_std": build_run_config({}).model.init_std,
        "paper_lr": {e: build_run_config({"model": {"n_layers": EXPERIMENTS[e][0],
                                                    "n_heads": EXPERIMENTS[e][1]}}).train.lr
                     for e in PLAIN_EXPERIMENTS},
        "shape": {e: list(EXPERIMENTS[e]) for e in PLAIN_EXPERIMENTS},
        "seq_len": cfg.task.seq_len, "d_model": cfg.task.d_model,
        "train_trigger_min": cfg.task.train_trigger_min,
        "train_trigger_max": cfg.task.train_trigger_max,
        "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
        "threshold": SINK_HEAD_THRESHOLD,
    }


def _untrained(cfg: RunConfig, device: torch.device) -> AttentionStack:
    """The run's stack as its training started: the same config and seed, no update, on
    ``device``."""
    return build_ensemble([cfg], device)


def plain_records(ctx: Context, seeds: int, n_sequences: int = PLAIN_SEQUENCES,
                  attack_steps: int = 100, restarts: int = PLAIN_ATTACK_RESTARTS
                  ) -> list[dict[str, Any]]:
    """One row per plain-target run (seeds ``PLAIN_FIRST_SEED`` on): how it stopped, its errors
    (the test set's, from ``summary.json``, the best training batch of its log, and the
    attack's worst case over every input: ``attacked``, the largest error per row type), and
    where its trained model puts its BOS weight on ``n_sequences`` sequences with every
    trigger position (``plain_measure``); ``untrained`` is the same measurement of the same
    stack before any update, the claims' control.

    ``ctx`` needs only ``out`` (the study's folder) and ``summary(name)``."""
    rows = []
    for e in PLAIN_EXPERIMENTS:
        for rule in PLAIN_RULES:
            for seed in range(PLAIN_FIRST_SEED, PLAIN_FIRST_SEED + seeds):
                name = plain_name(e, rule, seed)
                summary = ctx.summary(name)
                best = theory.floor(read_log(ctx.out / name / "metrics.jsonl"))["best_linf"]
                cfg, model = load_model(ctx.out / name)
                batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
                found = attack(model, cfg, steps=attack_steps, restarts=restarts,
                               per_coordinate=False)
                before = plain_measure(_untrained(cfg, batch.x.device), batch)
                rows.append({
                    "experiment": e, "rule": rule, "seed": seed, "status": summary["status"],
                    "converged": summary["converged"], "steps": summary["steps"],
                    "lr_drop_steps": summary.get("lr_drop_steps", []),
                    "best_train_linf": best, "test_linf": summary["linf_error"],
                    "linf_trigger": summary["linf_trigger"],
                    "linf_nontrigger": summary["linf_nontrigger"],
                    "attacked": found.to_dict(contents="none")["max"],
                    **plain_measure(model, batch),
                    "untrained": {k: before[k] for k in
                                  ("sink_heads", "positions_covered", "head_bos",
                                   "bos_max_by_position", "linf_all_triggers")},
                })
    return rows


def grid_records(ctx: Context, seeds: int) -> list[dict[str, Any]]:
    """One row per run of the protocol search (seeds 0..seeds-1): its grid point, how it
    stopped and its best training-batch L∞."""
    rows = []
    for e, rule, std, lr, seed in grid_runs(seeds):
        name = grid_name(e, rule, std, lr, seed)
        summary = ctx.summary(name)
        log = read_log(ctx.out / name / "metrics.jsonl")
        rows.append({
            "experiment": e, "rule": rule, "init_std": std, "lr": lr, "seed": seed,
            "status": summary["status"], "converged": summary["converged"],
            "steps": summary["steps"], "best_train_linf": theory.floor(log)["best_linf"],
        })
    return rows


def plain_collect(ctx: Context, seeds: int, max_steps: int,
                  n_sequences: int = PLAIN_SEQUENCES, grid_seeds: int = 0,
                  attack_steps: int = 100, restarts: int = PLAIN_ATTACK_RESTARTS
                  ) -> dict[str, Any]:
    """What the report's plain-target section reads, as ``records["plain"]``: the protocol, the
    protocol search (``grid``: its grid, one row per point, the choice per shape and rule; None
    without search seeds), the test sequences' count, one row per run and one per (experiment,
    rule)."""
    runs = plain_records(ctx, seeds, n_sequences, attack_steps, restarts)
    grid = None
    if grid_seeds:
        points = grid_points(grid_records(ctx, grid_seeds))
        grid = {"init_std": list(PLAIN_GRID_STD), "lr": list(PLAIN_GRID_LR),
                "seeds": grid_seeds, "rule": PLAIN_CHOICE_RULE, "points": points,
                "choice": plain_choice(points)}
    return {"protocol": plain_protocol(seeds, max_steps), "sequences": n_sequences,
            "grid": grid, "attack": {"steps": attack_steps, "restarts": restarts},
            "runs": runs, "groups": plain_groups(runs)}
