"""The zoo's extensions: sweeps past the paper's single setting, for softmax and ReLU.

``sinklab zoo`` runs these beside the rule table (``--no-extensions`` skips them). Every sweep
trains 1x1 models (and 2x2 where it says so) with the zoo's budget and seeds at the middle
learning rate of the zoo's grid (1e-3 for 1x1, 3e-4 for 2x2), as ensembles over the seeds. A
sweep's run with the zoo's own settings is the zoo's run (same folder), trained once.

- sequence length: train and test at ``seq_len`` in 8..128;
- trigger frequency: train with sequences that have no trigger or several
  (``task.no_trigger_prob``, ``task.max_triggers``), test on the paper's test set and on one
  shared mixed test set;
- length generalisation: the L = 16 models tested at L = 16, 32 and 64 (no training);
- the standard block: pre-LayerNorm and an MLP (``model.block=standard``) against attention only;
- sink emergence: non-trigger BOS mass and error against the training step, from the runs'
  training logs (every ``LOG_EVERY`` steps).

The BOS ablation at evaluation is part of the zoo's own table (every rule).
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from sinklab import metrics, plots, report
from sinklab.config import RunConfig, TaskConfig, derive_seed
from sinklab.evaluate import eval_batch, evaluate
from sinklab.experiments import zoo
from sinklab.results import read_json, read_metrics, read_npz, write_atomic, write_json
from sinklab.task import sample_batch
from sinklab.train import load_model

RULES = ("softmax", "relu")
LR = {"1x1": 1e-3, "2x2": 3e-4}  # the middle rate of each zoo grid
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
SINK_STEP_LEVELS = (0.5, 0.9)  # first step with the most sinking head at this BOS mass
ERROR_DROP = 0.1  # first step with the training batch L∞ below this
MOVED = 0.5  # a sink "moved" when a head puts this much of a non-trigger row on the query itself


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


def _cell(out: Path, opts: zoo.ZooOptions, sweep: str, config: str, rule: str, seed: int,
          task: dict[str, Any], model: dict[str, Any], tag: str) -> zoo.Cell:
    lr = LR[config]
    name = setting_name(task, model)
    return zoo.Cell((sweep, config, rule, name), config, rule, tag,
                    zoo.run_config(config, rule, lr, seed, opts, task, model),
                    zoo.run_dir(out, config, rule, lr, seed, name))


def seq_lens(opts: zoo.ZooOptions) -> tuple[int, ...]:
    return QUICK_SEQ_LENS if opts.quick else SEQ_LENS


def frequencies(opts: zoo.ZooOptions) -> tuple[tuple[float, int], ...]:
    return QUICK_FREQUENCIES if opts.quick else FREQUENCIES


def block_configs(opts: zoo.ZooOptions) -> tuple[str, ...]:
    return ("1x1",) if opts.quick else ("1x1", "2x2")


def _frequency_task(p: float, k: int) -> dict[str, Any]:
    return {"no_trigger_prob": p, "max_triggers": k}


def cells(out: Path, opts: zoo.ZooOptions) -> list[zoo.Cell]:
    """Every run the sweeps need (the length-generalisation and emergence studies reuse them)."""
    result = []
    for rule in RULES:
        for seed in range(opts.seeds):
            for n in seq_lens(opts):
                result.append(_cell(out, opts, "seq_len", "1x1", rule, seed, {"seq_len": n}, {},
                                    f"L={n}"))
            for p, k in frequencies(opts):
                result.append(_cell(out, opts, "trigger", "1x1", rule, seed,
                                    _frequency_task(p, k), {}, f"no-trigger {p:g}, <= {k}"))
            for config in block_configs(opts):
                for block in BLOCKS:
                    result.append(_cell(out, opts, "block", config, rule, seed, {},
                                        {"block": block}, f"{block} block"))
    return result


def _run_path(out: Path, config: str, rule: str, seed: int, task: dict[str, Any] | None = None,
              model: dict[str, Any] | None = None) -> Path:
    return zoo.run_dir(out, config, rule, LR[config], seed, setting_name(task or {}, model or {}))


# ------------------------------------------------------------------- evaluations (cached)


def _max_head(values: list[list[float]]) -> float:
    return float(np.max(values))


@torch.no_grad()
def length_evaluation(path: Path) -> list[dict[str, Any]]:
    """A trained model tested at every length in ``EVAL_LENGTHS``, trigger at 7 and at L - 1;
    computed once and kept with the run in lengths.json."""
    cached = path / "lengths.json"
    if not cached.is_file():
        cfg, model = load_model(path)
        rows = []
        for n in EVAL_LENGTHS:
            for trigger in dict.fromkeys((cfg.task.eval_trigger, n - 1)):
                test_cfg = replace(cfg, task=replace(cfg.task, seq_len=n, eval_trigger=trigger))
                (m,), _ = evaluate(model, eval_batch(test_cfg, torch.device("cpu")))
                rows.append({"seq_len": n, "trigger": trigger,
                             "linf_nontrigger": m["linf_nontrigger"],
                             "linf_trigger": m["linf_trigger"],
                             "bos_max": _max_head(m["bos_mass_nontrigger"])})
        write_json(cached, rows)
    return read_json(cached)


@torch.no_grad()
def mixed_evaluation(path: Path) -> dict[str, Any]:
    """A trained model tested on the shared mixed test set (``MIXED``): L∞ error over the
    sequences with no trigger, one, and several, and the non-trigger BOS mass; computed once
    and kept with the run in mixed.json."""
    cached = path / "mixed.json"
    if not cached.is_file():
        cfg, model = load_model(path)
        task = replace(MIXED, seq_len=cfg.task.seq_len, d_model=cfg.task.d_model,
                       train_trigger_max=cfg.task.seq_len - 1)
        gen = torch.Generator().manual_seed(derive_seed(cfg.eval.seed, "mixed"))
        batch = sample_batch(task, MIXED_SEQUENCES, gen, residual=cfg.residual)
        out = model(batch.x, return_weights=True)
        count = batch.trigger.sum(-1)
        err = (out.out[0] - batch.y).abs().amax(dim=(-2, -1))  # per sequence
        result: dict[str, Any] = {}
        for name, sel in (("none", count == 0), ("one", count == 1), ("several", count >= 2)):
            result[f"linf_{name}"] = err[sel].max().item()
            result[f"n_{name}"] = int(sel.sum())
        bos = torch.stack([metrics.bos_mass_nontrigger(w[0], batch.trigger)
                           for w in out.patterns])
        result["bos_max"] = bos.max().item()
        write_json(cached, result)
    return read_json(cached)


def _self_mass(path: Path, cfg: RunConfig) -> float:
    """The largest mean weight a head puts on the query itself at non-trigger rows, read off
    the run's mean attention maps (test set, trigger at ``eval_trigger``)."""
    mean = torch.from_numpy(read_npz(path / "attention.npz")["mean"])  # (layers, heads, L, L)
    trigger = torch.tensor([cfg.task.eval_trigger])
    return metrics.self_mass_nontrigger(mean[:, None], trigger).max().item()


# ------------------------------------------------------------------------------ collect


def _run(path: Path) -> dict[str, Any]:
    s = read_json(path / "summary.json")
    return {"seed": s["seed"], "converged": s["converged"], "steps": s["steps"],
            "linf": s["linf_error"], "mse": s["mse"], "linf_nontrigger": s["linf_nontrigger"],
            "linf_trigger": s["linf_trigger"], "bos_max": _max_head(s["bos_mass_nontrigger"]),
            "sink_heads": s["sink_heads"]}


def first_step(log: list[dict[str, Any]], key: str, test: Any) -> int | None:
    """The first logged step whose value passes ``test``, or None."""
    return next((row["step"] for row in log if test(row[key])), None)


def emergence(path: Path) -> dict[str, Any]:
    """A run's training curve (most sinking head's BOS mass, batch L∞) and its landmarks."""
    log = read_metrics(path / "metrics.jsonl")
    for row in log:
        row["bos_max"] = _max_head(row["bos_mass_nontrigger"])
    result = {"step": [r["step"] for r in log], "bos_max": [r["bos_max"] for r in log],
              "linf": [r["linf"] for r in log],
              "error_drop_step": first_step(log, "linf", lambda v: v < ERROR_DROP)}
    for level in SINK_STEP_LEVELS:
        result[f"bos{level:g}_step"] = first_step(log, "bos_max", lambda v, t=level: v >= t)
    return result


def collect(out: Path, opts: zoo.ZooOptions) -> dict[str, Any]:
    """Every sweep's runs and numbers, from the finished run folders."""
    seeds = range(opts.seeds)
    result: dict[str, Any] = {"seq_len": [], "trigger": [], "length": [], "block": [],
                              "emergence": []}
    for rule in RULES:
        for n in seq_lens(opts):
            runs = [_run(_run_path(out, "1x1", rule, s, {"seq_len": n})) for s in seeds]
            result["seq_len"].append({"rule": rule, "seq_len": n, "runs": runs})
        for p, k in frequencies(opts):
            runs = []
            for s in seeds:
                path = _run_path(out, "1x1", rule, s, _frequency_task(p, k))
                runs.append({**_run(path), "mixed": mixed_evaluation(path)})
            result["trigger"].append({"rule": rule, "no_trigger_prob": p, "max_triggers": k,
                                      "runs": runs})
        for config in block_configs(opts):
            for block in BLOCKS:
                runs = []
                for s in seeds:
                    path = _run_path(out, config, rule, s, model={"block": block})
                    cfg = zoo.run_config(config, rule, LR[config], s, opts,
                                         model={"block": block})
                    runs.append({**_run(path), "self_max": _self_mass(path, cfg)})
                result["block"].append({"config": config, "rule": rule, "block": block,
                                        "runs": runs})
            # the paper's models (attention blocks at L = 16): tested longer, and their curves
            paths = [_run_path(out, config, rule, s) for s in seeds]
            base = [_run(p) for p in paths]
            result["length"].append({"config": config, "rule": rule,
                                     "runs": [{"seed": b["seed"], "converged": b["converged"],
                                               "tests": length_evaluation(p)}
                                              for b, p in zip(base, paths)]})
            result["emergence"].append({"config": config, "rule": rule,
                                        "runs": [{"seed": b["seed"], "steps": b["steps"],
                                                  "converged": b["converged"], **emergence(p)}
                                                 for b, p in zip(base, paths)]})
    for entry in result["block"]:
        entry["fate"] = sink_fate(entry, result["block"])
    return result


def sink_fate(entry: dict[str, Any], entries: list[dict[str, Any]]) -> str:
    """What the standard block did to the attention-only model's sink, from the BOS and self
    masses of the most sinking heads (mean over seeds)."""
    if entry["block"] == "attention":
        return "baseline"
    base = next(e for e in entries if (e["config"], e["rule"], e["block"])
                == (entry["config"], entry["rule"], "attention"))
    had = report.finite_mean([r["bos_max"] for r in base["runs"]]) >= zoo.SINK_SHARE
    bos = report.finite_mean([r["bos_max"] for r in entry["runs"]])
    self_mass = report.finite_mean([r["self_max"] for r in entry["runs"]])
    if bos >= zoo.SINK_SHARE:
        return "survives" if had else "appears"
    if self_mass >= MOVED:
        return "moves to the query itself" if had else "none; heads attend to themselves"
    return "vanishes" if had else "none"


# ------------------------------------------------------------------------------ outputs


def _conv(runs: list[dict[str, Any]]) -> str:
    return f"{sum(r['converged'] for r in runs)}/{len(runs)}"


def _median(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "never"
    text = f"{int(np.median(known)):,}"
    return text if len(known) == len(values) else f"{text} ({len(known)}/{len(values)} seeds)"


CSV_FIELDS = ("sweep", "config", "rule", "setting", "seed", "converged", "steps", "linf",
              "linf_nontrigger", "linf_trigger", "bos_max")


def to_csv(ext: dict[str, Any]) -> str:
    """One row per trained run of the sweeps (length generalisation: one per test)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    for e in ext["seq_len"]:
        for r in e["runs"]:
            writer.writerow({**r, "sweep": "seq_len", "config": "1x1", "rule": e["rule"],
                             "setting": f"L={e['seq_len']}"})
    for e in ext["trigger"]:
        for r in e["runs"]:
            writer.writerow({**r, "sweep": "trigger", "config": "1x1", "rule": e["rule"],
                             "setting": f"no_trigger_prob={e['no_trigger_prob']:g} "
                                        f"max_triggers={e['max_triggers']}"})
    for e in ext["block"]:
        for r in e["runs"]:
            writer.writerow({**r, "sweep": "block", "config": e["config"], "rule": e["rule"],
                             "setting": f"block={e['block']}"})
    for e in ext["length"]:
        for r in e["runs"]:
            for t in r["tests"]:
                writer.writerow({**t, "sweep": "length", "config": e["config"], "rule": e["rule"],
                                 "seed": r["seed"], "converged": r["converged"],
                                 "setting": f"test L={t['seq_len']} trigger={t['trigger']}"})
    return buf.getvalue()


def seq_len_table(ext: dict[str, Any]) -> str:
    rows = [[e["rule"], e["seq_len"], _conv(e["runs"]),
             _median([r["steps"] for r in e["runs"]]),
             report.spread([r["linf"] for r in e["runs"]], fmt=".2e"),
             report.spread([r["linf_nontrigger"] for r in e["runs"]], fmt=".2e"),
             report.spread([r["bos_max"] for r in e["runs"]], fmt=".3f")] for e in ext["seq_len"]]
    return report.table(["rule", "seq_len", "converged", "steps (median)", "test L∞",
                         "L∞ non-trigger rows", "BOS mass (most sinking head)"], rows)


def trigger_table(ext: dict[str, Any]) -> str:
    rows = []
    for e in ext["trigger"]:
        runs = e["runs"]
        mixed = [r["mixed"] for r in runs]
        rows.append([e["rule"], f"{e['no_trigger_prob']:g}", e["max_triggers"], _conv(runs),
                     report.spread([r["linf"] for r in runs], fmt=".2e"),
                     *[report.spread([m[f"linf_{g}"] for m in mixed], fmt=".2e")
                       for g in ("none", "one", "several")],
                     report.spread([r["bos_max"] for r in runs], fmt=".3f")])
    return report.table(["rule", "P(no trigger)", "max triggers", "converged",
                         "test L∞ (paper test set)", "mixed: L∞ no trigger", "mixed: L∞ one",
                         "mixed: L∞ several", "BOS mass (paper test set)"], rows)


def length_table(ext: dict[str, Any]) -> str:
    rows = []
    for e in ext["length"]:
        tests = [t for r in e["runs"] for t in r["tests"]]
        for key in dict.fromkeys((t["seq_len"], t["trigger"]) for t in tests):
            sel = [t for t in tests if (t["seq_len"], t["trigger"]) == key]
            rows.append([e["config"], e["rule"], _conv(e["runs"]), key[0], key[1],
                         report.spread([t["linf_nontrigger"] for t in sel], fmt=".2e"),
                         report.spread([t["linf_trigger"] for t in sel], fmt=".2e"),
                         report.spread([t["bos_max"] for t in sel], fmt=".3f")])
    return report.table(["config", "rule", "converged (L = 16)", "test seq_len", "trigger at",
                         "L∞ non-trigger rows", "L∞ trigger row", "BOS mass (most sinking head)"],
                        rows)


def block_table(ext: dict[str, Any]) -> str:
    rows = [[e["config"], e["rule"], e["block"], _conv(e["runs"]),
             report.spread([r["linf"] for r in e["runs"]], fmt=".2e"),
             report.spread([r["bos_max"] for r in e["runs"]], fmt=".3f"),
             report.spread([r["self_max"] for r in e["runs"]], fmt=".3f"),
             report.spread([r["sink_heads"] for r in e["runs"]], fmt=".1f"), e["fate"]]
            for e in ext["block"]]
    return report.table(["config", "rule", "block", "converged", "test L∞",
                         "BOS mass (most sinking head)", "self mass (most self-attending head)",
                         "sink heads", "the sink"], rows)


def emergence_table(ext: dict[str, Any]) -> str:
    rows = []
    for e in ext["emergence"]:
        runs = e["runs"]
        rows.append([e["config"], e["rule"], _conv(runs),
                     f"{report.finite_mean([r['bos_max'][0] for r in runs]):.3f}",
                     *[_median([r[f"bos{level:g}_step"] for r in runs])
                       for level in SINK_STEP_LEVELS],
                     _median([r["error_drop_step"] for r in runs]),
                     _median([r["steps"] for r in runs])])
    levels = [f"first step with BOS mass >= {level:g}" for level in SINK_STEP_LEVELS]
    return report.table(["config", "rule", "converged", "BOS mass at step 0", *levels,
                         f"first step with batch L∞ < {ERROR_DROP:g}", "stop step"], rows)


def write_figures(out: Path, ext: dict[str, Any]) -> list[Path]:
    paths = []
    colors = {"softmax": "tab:blue", "relu": "tab:orange"}

    def scatter_line(ax: Any, xs: list[Any], per_x: list[list[float]], rule: str,
                     label: str) -> None:
        for x, values in zip(xs, per_x):
            ax.scatter([x] * len(values), values, color=colors[rule], s=10, alpha=0.6)
        ax.plot(xs, [report.finite_mean(v) for v in per_x], color=colors[rule], label=label)

    fig = Figure(figsize=(11, 3.8))
    ax_bos, ax_err = fig.subplots(1, 2)
    for rule in RULES:
        sel = [e for e in ext["seq_len"] if e["rule"] == rule]
        xs = [e["seq_len"] for e in sel]
        scatter_line(ax_bos, xs, [[r["bos_max"] for r in e["runs"]] for e in sel], rule, rule)
        scatter_line(ax_err, xs, [[r["linf"] for r in e["runs"]] for e in sel], rule, rule)
    for ax, title in ((ax_bos, "non-trigger BOS mass, most sinking head"),
                      (ax_err, "test L∞ error (log)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seq_len (train and test)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")
    ax_err.axhline(5e-3, color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    paths.append(out / "figures" / "fig_ext_seq_len.png")
    plots.save_figure(fig, paths[-1])

    fig = Figure(figsize=(11, 3.8))
    ax_bos, ax_err = fig.subplots(1, 2)
    width = 0.4
    for i, rule in enumerate(RULES):
        sel = [e for e in ext["trigger"] if e["rule"] == rule]
        xs = np.arange(len(sel)) + (i - 0.5) * width
        ax_bos.bar(xs, [report.finite_mean([r["bos_max"] for r in e["runs"]]) for e in sel], width,
                   color=colors[rule], label=rule)
        ax_err.bar(xs, [report.finite_mean([r["linf"] for r in e["runs"]]) for e in sel], width,
                   color=colors[rule], label=rule)
    labels = [f"p={e['no_trigger_prob']:g}\nk<={e['max_triggers']}"
              for e in ext["trigger"] if e["rule"] == RULES[0]]
    for ax, title in ((ax_bos, "non-trigger BOS mass (paper test set)"),
                      (ax_err, "test L∞ error (paper test set, log)")):
        ax.set_xticks(np.arange(len(labels)), labels, fontsize=7)
        ax.set_title(title + "; p = P(no trigger), k = max triggers", fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")
    fig.tight_layout()
    paths.append(out / "figures" / "fig_ext_trigger.png")
    plots.save_figure(fig, paths[-1])

    configs = list(dict.fromkeys(e["config"] for e in ext["length"]))
    fig = Figure(figsize=(5.5 * len(configs), 3.8))
    axes = fig.subplots(1, len(configs), squeeze=False)[0]
    for ax, config in zip(axes, configs):
        for e in (e for e in ext["length"] if e["config"] == config):
            tests = [t for r in e["runs"] for t in r["tests"]]
            for far, style in ((False, "-"), (True, ":")):
                sel = [t for t in tests if (t["trigger"] == t["seq_len"] - 1) == far]
                xs = sorted({t["seq_len"] for t in sel})
                ys = [report.finite_mean([t["linf_nontrigger"] for t in sel if t["seq_len"] == x])
                      for x in xs]
                where = "at L - 1" if far else "at 7"
                ax.plot(xs, ys, style, marker="o", color=colors[e["rule"]],
                        label=f"{e['rule']}, trigger {where}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-5)  # an exact zero (ReLU's off rows) stays visible
        ax.set_ylim(bottom=0)
        ax.set_xlabel("test seq_len (trained at 16)")
        ax.set_title(f"{config}: L∞ error at non-trigger rows (symlog, linear below 1e-5)",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "figures" / "fig_ext_length.png")
    plots.save_figure(fig, paths[-1])

    fig = Figure(figsize=(11, 3.8))
    ax_bos, ax_self = fig.subplots(1, 2)
    labels = [f"{e['config']} {e['rule']}\n{e['block']}" for e in ext["block"]]
    for ax, key, title in ((ax_bos, "bos_max", "BOS mass, most sinking head"),
                           (ax_self, "self_max", "self mass, most self-attending head")):
        for x, e in enumerate(ext["block"]):
            values = [r[key] for r in e["runs"]]
            ax.bar(x, report.finite_mean(values), color=colors[e["rule"]],
                   alpha=1.0 if e["block"] == "attention" else 0.5)
            ax.scatter([x] * len(values), values, color="black", s=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"non-trigger rows: {title}", fontsize=9)
    fig.tight_layout()
    paths.append(out / "figures" / "fig_ext_block.png")
    plots.save_figure(fig, paths[-1])

    configs = list(dict.fromkeys(e["config"] for e in ext["emergence"]))
    fig = Figure(figsize=(11, 3.6 * len(configs)))
    axes = fig.subplots(len(configs), 2, squeeze=False)
    for row, config in zip(axes, configs):
        for e in (e for e in ext["emergence"] if e["config"] == config):
            for i, r in enumerate(e["runs"]):
                label = e["rule"] if i == 0 else None
                row[0].plot(r["step"], r["bos_max"], color=colors[e["rule"]], lw=0.8,
                            label=label)
                row[1].plot(r["step"], r["linf"], color=colors[e["rule"]], lw=0.8, label=label)
        row[0].set_title(f"{config}: non-trigger BOS mass (training batch, most sinking head)",
                         fontsize=9)
        row[1].set_title(f"{config}: training batch L∞ error (log)", fontsize=9)
        row[1].set_yscale("log")
        row[1].axhline(ERROR_DROP, color="grey", ls="--", lw=0.8)
        for ax in row:
            ax.set_xlabel("training step")
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "figures" / "fig_ext_emergence.png")
    plots.save_figure(fig, paths[-1])
    return paths


def render(ext: dict[str, Any], prefix: str, opts_text: str) -> list[str]:
    """The "Extensions" part of ZOO.md."""
    mixed = (f"P(no trigger) = {MIXED.no_trigger_prob:.2g}, otherwise 1-{MIXED.max_triggers} "
             f"triggers, {MIXED_SEQUENCES} sequences")
    return [
        "## Extensions",
        "",
        f"Sweeps past the paper's setting for softmax and ReLU, {opts_text}. Learning rate "
        f"{LR['1x1']:g} (1x1) and {LR['2x2']:g} (2x2), the middle of the zoo's grid; mean ± sd "
        "over seeds; \"BOS mass\" is the non-trigger BOS mass of the most sinking head on the "
        "test set. Every number per run is in `extensions.csv` and `zoo.json`.",
        "",
        "### Sequence length",
        "",
        "Trained and tested at each length (1x1; training triggers anywhere in 2..L-1, test "
        "trigger at 7).",
        "",
        seq_len_table(ext),
        "",
        f"![BOS mass and error against seq_len]({prefix}/fig_ext_seq_len.png)",
        "",
        "### Trigger frequency",
        "",
        "Trained on sequences with no trigger with probability P(no trigger), otherwise 1 to "
        "\"max triggers\" triggers at distinct positions (`task.no_trigger_prob`, "
        "`task.max_triggers`). **Target with several triggers:** each trigger row j outputs "
        "mean(x_1..x_j), what a lone trigger at j would output (earlier triggers are among the "
        "averaged tokens); every other row outputs zero, and a sequence without a trigger is "
        f"zero everywhere. Tested on the paper's test set and on one mixed test set ({mixed}), "
        "whose L∞ error is split by the number of triggers in the sequence.",
        "",
        trigger_table(ext),
        "",
        f"![BOS mass and error against trigger frequency]({prefix}/fig_ext_trigger.png)",
        "",
        "### Length generalisation",
        "",
        "The models trained at L = 16 (the zoo's runs at this learning rate) tested, without "
        "training, on 1000 sequences of each length with the trigger at 7 and at L - 1 (beyond "
        "every training position when L > 16). There is no positional encoding, so the same "
        "weights apply at any length.",
        "",
        length_table(ext),
        "",
        f"![error against test length]({prefix}/fig_ext_length.png)",
        "",
        "### The standard block",
        "",
        "`model.block=standard`: each layer is x <- x + MHA(LN(x)); x <- x + MLP(LN(x)) (pre-"
        "LayerNorm, GELU MLP of width 4d, residual target), against the paper's attention-only "
        "layer. \"Self mass\" is the weight a non-trigger query puts on itself, where a sink that "
        "left BOS would most plausibly go. \"The sink\" (means over seeds): *survives* when the "
        f"most sinking head keeps BOS mass >= {zoo.SINK_SHARE:g} with both blocks, *moves* when "
        f"it falls below that and some head puts >= {MOVED:g} of its row on the query itself, "
        "*vanishes* otherwise.",
        "",
        block_table(ext),
        "",
        f"![BOS and self mass per block]({prefix}/fig_ext_block.png)",
        "",
        "### Sink emergence",
        "",
        f"Non-trigger BOS mass of the most sinking head and the L∞ error, both on the training "
        f"batch, every {zoo.LOG_EVERY} steps of the L = 16 attention-only runs (1x1 and 2x2), "
        "until the run stops. Steps are medians over seeds (\"never\": no seed got there).",
        "",
        emergence_table(ext),
        "",
        f"![BOS mass and error against training step]({prefix}/fig_ext_emergence.png)",
        "",
    ]


def write(out: Path, ext: dict[str, Any]) -> list[Path]:
    """extensions.csv and the figures; returns the figures."""
    write_atomic(out / "extensions.csv", to_csv(ext).encode())
    return write_figures(out, ext)
