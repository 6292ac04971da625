"""``sinklab zoo``: every attention rule on the task, with a fair budget and a shared LR grid.

Each rule is trained 1x1 and 2x2 with the paper's protocol except the learning rate: every
learning rate of a small shared grid, every seed, the same step budget and stop rule for all. Per
rule and configuration the learning rate with the lowest mean MSE on *validation* sequences (a
separate draw from the test set) is kept, and its test numbers are reported. Writes::

    runs/{1x1,2x2}_{rule}_lr{lr}_seed{s}/   one run folder each (config, metrics, summary,
                                          model, validation.json, ablation.json)
    figures/                              where each rule's "output zero" comes from
    zoo.json, zoo.csv, ZOO.md             every number, the table, the report

Rerunning with the same ``--out`` keeps every finished run.
"""

from __future__ import annotations

import csv
import io
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from sinklab import folders, plots, report
from sinklab.attention import ROW_KIND, RULES
from sinklab.config import ConfigError, RunConfig, build_run_config
from sinklab.evaluate import eval_batch, evaluate
from sinklab.experiments import reproduce as rep
from sinklab.metrics import GU_EPS, default_source
from sinklab.model import AttentionStack
from sinklab.results import read_json, write_atomic, write_json
from sinklab.sweeps.run import ensemble_cost
from sinklab.train import load_model, resolve_device, versions

TITLE = "# Zoo: which attention rules need a sink"  # the report's first line (--docs checks it)
CONFIGS = {"1x1": (1, 1), "2x2": (2, 2)}
LR_GRID = {"1x1": (3e-4, 1e-3, 3e-3), "2x2": (1e-4, 3e-4, 1e-3)}
STEPS = {"1x1": 3000, "2x2": 6000}  # the same budget for every rule
QUICK_STEPS = {"1x1": 600, "2x2": 300}
VALIDATION_SEED = 1  # the test set is eval.seed = 0
SOURCES = ("BOS", "sink logit", "closed gate", "zero row", "content")


@dataclass
class ZooOptions(rep.RunOptions):
    """What ``sinklab zoo`` runs; every value is checked on creation."""

    rules: tuple[str, ...] = tuple(sorted(RULES))
    extensions: bool = True  # also run the sweeps past the paper (sinklab.experiments.extensions)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.rules:
            raise ConfigError("--rules needs at least one rule name.")
        for rule in self.rules:
            if rule not in RULES:
                raise ConfigError(f"--rules: {rule!r} is not a known attention rule: choose from "
                                  f"{', '.join(sorted(RULES))}.")
            if self.rules.count(rule) > 1:
                raise ConfigError(f"--rules lists {rule!r} twice; give each rule once.")

    def runs_per_seed(self) -> int:
        runs = len(self.rules) * sum(len(self.lrs(c)) for c in CONFIGS)
        if self.extensions:
            from sinklab.experiments import extensions as ext

            runs += len(ext.RULES) * (len(ext.seq_lens(self)) + len(ext.frequencies(self))
                                      + len(ext.block_configs(self)) * len(ext.BLOCKS))
        return runs

    def steps(self, config: str) -> int:
        return (QUICK_STEPS if self.quick else STEPS)[config]

    def lrs(self, config: str) -> tuple[float, ...]:
        grid = LR_GRID[config]
        return grid[1:2] if self.quick else grid  # quick: the middle rate only


def parse_rules(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


LOG_EVERY = 10  # fine training logs: the sink-emergence curves are read from them


def run_config(config: str, rule: str, lr: float, seed: int, opts: ZooOptions,
               task: dict[str, Any] | None = None, model: dict[str, Any] | None = None
               ) -> RunConfig:
    """A zoo run: the paper's protocol with the zoo's budget, plus any task or model settings
    (the extensions' sweeps)."""
    layers, heads = CONFIGS[config]
    return build_run_config({
        "task": dict(task or {}),
        "model": {"attention": rule, "n_layers": layers, "n_heads": heads, **(model or {})},
        "train": {"seed": seed, "lr": lr, "max_steps": opts.steps(config), "device": opts.device,
                  "log_every": LOG_EVERY},
    })


def run_dir(out: Path, config: str, rule: str, lr: float, seed: int, setting: str = "") -> Path:
    """A run's folder; ``setting`` names what differs from the plain zoo run (e.g. ``_L32``), so
    a sweep's run with the zoo's own settings is the zoo's run, trained once."""
    return out / "runs" / f"{config}_{rule}_lr{lr:g}{setting}_seed{seed}"


@dataclass(frozen=True)
class Cell:
    """One run to have: runs with the same ``group`` train together as one ensemble."""

    group: tuple[Any, ...]
    config: str  # "1x1" or "2x2"
    rule: str
    tag: str  # what the job is, for the progress log
    cfg: RunConfig
    path: Path


def members(opts: ZooOptions, config: str) -> list[tuple[float, int]]:
    return [(lr, seed) for lr in opts.lrs(config) for seed in range(opts.seeds)]


def zoo_cells(out: Path, opts: ZooOptions) -> list[Cell]:
    """Every rule, 1x1 and 2x2: one ensemble per (configuration, rule) over the LR grid and
    the seeds."""
    return [Cell(("zoo", config, rule), config, rule, "lr grid",
                 run_config(config, rule, lr, seed, opts), run_dir(out, config, rule, lr, seed))
            for config in CONFIGS for rule in opts.rules for lr, seed in members(opts, config)]


def plan(out: Path, opts: ZooOptions) -> tuple[list[rep.Job], int]:
    """The unfinished runs of the zoo (and its extensions), as one job per ensemble."""
    cells = zoo_cells(out, opts)
    if opts.extensions:
        from sinklab.experiments import extensions

        cells += extensions.cells(out, opts)
    unique: dict[Path, Cell] = {}
    for cell in cells:  # a sweep's run with the zoo's settings is the zoo's run
        unique.setdefault(cell.path, cell)
    groups: dict[tuple[Any, ...], list[Cell]] = {}
    done = 0
    for cell in unique.values():
        if rep.is_finished(cell.path, cell.cfg):
            done += 1
        else:
            groups.setdefault(cell.group, []).append(cell)
    jobs = [rep.Job(g[0].config, g[0].rule, [c.cfg for c in g], [c.path for c in g],
                    tag=g[0].tag) for g in groups.values()]

    jobs.sort(key=lambda job: ensemble_cost(job.configs[0], len(job.configs)), reverse=True)
    return jobs, done


@torch.no_grad()
def validation_mse(cfg: RunConfig, model: AttentionStack) -> float:
    """MSE of a trained model on the validation sequences (not the test set)."""
    val_cfg = replace(cfg, eval=replace(cfg.eval, seed=VALIDATION_SEED))
    (metrics,), _ = evaluate(model, eval_batch(val_cfg, torch.device("cpu")))
    return metrics["mse"]


ABLATION_KEYS = ("linf_trigger", "linf_nontrigger", "mse_trigger", "mse_nontrigger")


@torch.no_grad()
def bos_ablation(cfg: RunConfig, model: AttentionStack) -> dict[str, float]:
    """A trained model's test errors with BOS hidden from every query but its own
    (``model.bos=ablated``), at trigger and non-trigger rows."""
    ablated = AttentionStack(replace(cfg.model, bos="ablated"), cfg.task.d_model,
                             residual=cfg.residual)
    ablated.load_state_dict(model.state_dict())
    (metrics,), _ = evaluate(ablated, eval_batch(cfg, torch.device("cpu")))
    return {key: metrics[key] for key in ABLATION_KEYS}


def evaluations(path: Path) -> tuple[float, dict[str, float]]:
    """A finished run's validation MSE and BOS-ablation errors, computed once (one model load)
    and then kept with the run in validation.json and ablation.json."""
    val_path, ablation_path = path / "validation.json", path / "ablation.json"
    if not (val_path.is_file() and ablation_path.is_file()):
        cfg, model = load_model(path)
        write_json(val_path, {"mse": validation_mse(cfg, model), "seed": VALIDATION_SEED})
        write_json(ablation_path, bos_ablation(cfg, model))
    val = read_json(val_path)["mse"]
    return (float("nan") if val is None else val), read_json(ablation_path)


def _head_sources(summary: dict[str, Any], rule: str) -> list[list[str]]:
    """Where each head's zero comes from, [layer][head]."""
    return [[default_source(b, rn, rt, ROW_KIND[rule]) for b, rn, rt in zip(bl, rnl, rtl)]
            for bl, rnl, rtl in zip(summary["bos_mass_nontrigger"],
                                    summary["row_sum_nontrigger"], summary["row_sum_trigger"])]


def collect(out: Path, opts: ZooOptions) -> list[dict[str, Any]]:
    """One entry per (configuration, rule): every run, the chosen learning rate, its numbers."""
    entries = []
    for config in CONFIGS:
        for rule in opts.rules:
            runs = []
            for lr, seed in members(opts, config):
                path = run_dir(out, config, rule, lr, seed)
                summary = read_json(path / "summary.json")
                val, ablated = evaluations(path)
                summary = {**summary, "bos_ablated": ablated}
                run = {**summary, "validation_mse": val, "sources": _head_sources(summary, rule)}
                runs.append({**run, "sinks": sinks(run, rule)})
            by_lr = {lr: [r for r in runs if r["lr"] == lr] for lr in opts.lrs(config)}
            score = {lr: float(np.mean([r["validation_mse"] if np.isfinite(r["validation_mse"])
                                        else np.inf for r in rs])) for lr, rs in by_lr.items()}
            best = min(score, key=lambda lr: score[lr])
            entries.append({"config": config, "rule": rule, "row_kind": ROW_KIND[rule],
                            "lr": best, "validation_mse_by_lr": score,
                            "chosen": summarise(by_lr[best]), "runs": runs})
    return entries


SINK_SHARE = 0.9  # a head sinks when its row is on and at least this share of it is on BOS


def sinks(run: dict[str, Any], rule: str) -> bool:
    """Whether some head of a run parks its non-trigger rows on BOS (the theorem's sink).

    Judged by BOS's share of the row, so a gated head whose half-open gate scales a softmax
    that sits on BOS counts as sinking; an all-zero ReLU row does not.
    """
    for bl, rnl, sources in zip(run["bos_mass_nontrigger"], run["row_sum_nontrigger"],
                                run["sources"]):
        for b, rn, source in zip(bl, rnl, sources):
            if source == "BOS" and b >= SINK_SHARE * rn:
                return True
    return False


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The chosen learning rate's seeds: errors, sink numbers, where "zero" comes from."""
    bos_max = [float(np.max(r["bos_mass_nontrigger"])) for r in runs]
    sources = [s for r in runs for layer in r["sources"] for s in layer]
    return {
        "seeds": [r["seed"] for r in runs],
        "converged": sum(r["converged"] for r in runs), "n": len(runs),
        "steps": [r["steps"] for r in runs],
        "linf": [r["linf_error"] for r in runs], "mse": [r["mse"] for r in runs],
        "bos_max": bos_max,
        "bos_mean": [float(np.mean(r["bos_mass_nontrigger"])) for r in runs],
        "row_sum_nontrigger": [float(np.mean(r["row_sum_nontrigger"])) for r in runs],
        "row_sum_trigger": [float(np.mean(r["row_sum_trigger"])) for r in runs],
        "sink_rate": [r["sink_rate"] for r in runs],
        "sink_rate_relative": [r["sink_rate_relative"] for r in runs],
        "sources": {s: sources.count(s) for s in SOURCES if s in sources},
        "n_heads": len(sources),
        "uses_bos_sink": sum(r["sinks"] for r in runs),
        "ablation": {key: {"intact": [r[key] for r in runs],
                           "ablated": [r["bos_ablated"][key] for r in runs]}
                     for key in ABLATION_KEYS},
    }


def run_zoo(out: Path, opts: ZooOptions, *, log: Callable[[str], None] | None = None,
            docs: Path | None = None, command: str | None = None) -> dict[str, Any]:
    """Run (or resume) the zoo in ``out``; write zoo.json, zoo.csv, figures and ZOO.md."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    rep.check_docs(docs, TITLE)
    with opts.session(), folders.writing(out, "zoo"):
        return _run_zoo(out, opts, log, docs, command)


def _run_zoo(out: Path, opts: ZooOptions, log: Callable[[str], None], docs: Path | None,
             command: str | None) -> dict[str, Any]:
    jobs, done = plan(out, opts)
    workers = rep.worker_count(opts.workers, resolve_device(opts.device), len(jobs))
    n_runs = sum(len(j.configs) for j in jobs)
    log(f"zoo: {n_runs} runs to train in {len(jobs)} jobs on {workers} worker(s); {done} "
        f"already finished in {out}")
    start = time.perf_counter()
    rep.run_all(jobs, workers, log, out, opts)
    entries = collect(out, opts)
    ext = None
    if opts.extensions:
        from sinklab.experiments import extensions

        ext = extensions.collect(out, opts)
    wall = time.perf_counter() - start
    invocation = {"command": command or f"sinklab zoo --out {out}",
                  "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  "wall_time_s": wall, "runs_trained": n_runs, "runs_reused": done,
                  "workers": workers}
    marker = rep.record_invocation(out, invocation)  # the folder's history, as for reproduce
    result = {
        **invocation, "history": marker["invocations"],
        "versions": versions(), "quick": opts.quick, "seeds": opts.seeds,
        "steps": {c: opts.steps(c) for c in CONFIGS}, "lr_grid": {c: opts.lrs(c) for c in CONFIGS},
        "entries": entries, "extensions": ext,
    }
    write_json(out / "zoo.json", result)
    write_atomic(out / "zoo.csv", to_csv(entries).encode())
    figures = write_figures(out, entries)
    if ext is not None:
        figures += extensions.write(out, ext)
    write_atomic(out / "ZOO.md", render(result, "figures").encode())
    if docs is not None:
        rep.copy_to_docs(Path(docs), figures, lambda prefix: render(result, prefix))
    log(f"zoo: wrote {out / 'ZOO.md'} ({wall:.0f} s)")
    return result


# ------------------------------------------------------------------------------- outputs


CSV_FIELDS = ("config", "rule", "row_kind", "lr", "converged", "n", "linf_mean", "linf_sd",
              "mse_mean", "mse_sd", "bos_max_mean", "bos_max_sd", "row_sum_nontrigger_mean",
              "row_sum_trigger_mean", "sink_rate_mean", "sink_rate_relative_mean",
              "uses_bos_sink", "default_from")


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    c = entry["chosen"]
    return {
        "config": entry["config"], "rule": entry["rule"], "row_kind": entry["row_kind"],
        "lr": entry["lr"], "converged": c["converged"], "n": c["n"],
        "linf_mean": report.finite_mean(c["linf"]), "linf_sd": report.finite_sd(c["linf"]),
        "mse_mean": report.finite_mean(c["mse"]), "mse_sd": report.finite_sd(c["mse"]),
        "bos_max_mean": report.finite_mean(c["bos_max"]),
        "bos_max_sd": report.finite_sd(c["bos_max"]),
        "row_sum_nontrigger_mean": report.finite_mean(c["row_sum_nontrigger"]),
        "row_sum_trigger_mean": report.finite_mean(c["row_sum_trigger"]),
        "sink_rate_mean": report.finite_mean(c["sink_rate"]),
        "sink_rate_relative_mean": report.finite_mean(c["sink_rate_relative"]),
        "uses_bos_sink": c["uses_bos_sink"],
        "default_from": "; ".join(f"{k} {v}/{c['n_heads']}" for k, v in c["sources"].items()),
    }


def to_csv(entries: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for entry in entries:
        writer.writerow(_row(entry))
    return buf.getvalue()


def table(entries: list[dict[str, Any]], config: str) -> str:
    rows = []
    for entry in entries:
        if entry["config"] != config:
            continue
        r, c = _row(entry), entry["chosen"]
        relative = r["row_kind"] != "simplex"
        rows.append([
            r["rule"], f"{r['lr']:g}", f"{r['converged']}/{r['n']}",
            report.spread(c["linf"], fmt=".2e"), report.spread(c["mse"], fmt=".2e"),
            report.spread(c["bos_max"], fmt=".3f"),
            f"{r['row_sum_nontrigger_mean']:.3f} / {r['row_sum_trigger_mean']:.3f}",
            f"{r['sink_rate_mean']:.0f}%"
            + (f" ({r['sink_rate_relative_mean']:.0f}%)" if relative else ""),
            r["default_from"],
            "yes" if r["uses_bos_sink"] == r["n"] else
            ("no" if r["uses_bos_sink"] == 0 else f"{r['uses_bos_sink']}/{r['n']} seeds"),
        ])
    return report.table(["rule", "lr", "converged", "test L∞", "test MSE",
                         "BOS mass (most sinking head)", "row sum non-trigger / trigger",
                         f"Gu sink rate eps={GU_EPS} (relative)", "\"zero\" comes from (heads)",
                         "sinks on BOS"], rows)


def ablation_table(entries: list[dict[str, Any]]) -> str:
    rows = []
    for e in entries:
        a = e["chosen"]["ablation"]
        cells = [f"{report.finite_mean(a[k]['intact']):.2e} -> "
                 f"{report.finite_mean(a[k]['ablated']):.2e}"
                 for k in ("linf_nontrigger", "linf_trigger")]
        rows.append([e["config"], e["rule"], f"{e['chosen']['converged']}/{e['chosen']['n']}",
                     *cells])
    return report.table(["config", "rule", "converged", "L∞ non-trigger rows",
                         "L∞ trigger rows"], rows)


def write_figures(out: Path, entries: list[dict[str, Any]]) -> list[Path]:
    fig = Figure(figsize=(12, 4.2))
    for i, config in enumerate(CONFIGS):
        ax = fig.add_subplot(1, 2, i + 1)
        sel = [e for e in entries if e["config"] == config]
        names = [e["rule"] for e in sel]
        xs = np.arange(len(sel))
        bottom = np.zeros(len(sel))
        for source in SOURCES:
            share = np.array([e["chosen"]["sources"].get(source, 0) / e["chosen"]["n_heads"]
                              for e in sel])
            ax.bar(xs, share, bottom=bottom, label=source)
            bottom += share
        for x, e in zip(xs, sel):
            ax.annotate(f"{e['chosen']['converged']}/{e['chosen']['n']}", (x, 1.02),
                        ha="center", fontsize=7)
        ax.set_xticks(xs, names, rotation=45, ha="right")
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of heads (all seeds)")
        ax.set_title(f"{config}: where \"output zero\" comes from (converged seeds on top)",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "figures" / "fig_zoo_sources.png"
    plots.save_figure(fig, path)
    fig = Figure(figsize=(12, 4.2))
    for i, config in enumerate(CONFIGS):
        ax = fig.add_subplot(1, 2, i + 1)
        sel = [e for e in entries if e["config"] == config]
        for x, e in enumerate(sel):
            c = e["chosen"]
            ax.scatter([x] * len(c["bos_max"]), c["bos_max"], color="tab:blue", s=14,
                       label="BOS mass, most sinking head" if x == 0 else None)
            ax.scatter([x] * len(c["linf"]), np.clip(c["linf"], 0, 1), color="tab:red",
                       marker="x", s=14, label="test L∞ (clipped at 1)" if x == 0 else None)
        ax.axhline(0.9, color="grey", ls="--", lw=0.8)
        ax.set_xticks(range(len(sel)), [e["rule"] for e in sel], rotation=45, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{config}: per seed, at the chosen learning rate", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path2 = out / "figures" / "fig_zoo_bos.png"
    plots.save_figure(fig, path2)
    return [path, path2]


def render(result: dict[str, Any], prefix: str) -> str:
    v = result["versions"]
    entries = result["entries"]
    lines = [
        TITLE,
        "",
        f"- Written by: `{result['command']}` on {result['date']}"
        + (" (**quick mode**: short budgets, one learning rate)" if result["quick"] else ""),
        "- How the runs in this folder were trained (every finished invocation):",
        *[f"  - `{h['command']}` on {h['date']}: {h['runs_trained']} runs trained "
          f"({h['runs_reused']} reused) in {h['wall_time_s']:.0f} s, {h['workers']} worker "
          "process(es)" for h in result["history"]],
        f"- Versions: sinklab {v['sinklab']}, torch {v['torch']}, Python {v['python']}",
        f"- Budget: the paper's protocol (Adam 0.9/0.95, batch 128, stop at batch L∞ < 5e-3) "
        f"with at most {result['steps']['1x1']:,} steps (1x1) and {result['steps']['2x2']:,} "
        f"(2x2) for every rule; {result['seeds']} seed(s); learning rates "
        f"{', '.join(f'{x:g}' for x in result['lr_grid']['1x1'])} (1x1) and "
        f"{', '.join(f'{x:g}' for x in result['lr_grid']['2x2'])} (2x2), the one with the "
        f"lowest mean MSE on 1000 validation sequences (eval seed {VALIDATION_SEED}) kept per "
        "rule. Test numbers: 1000 other sequences, trigger at position 7; mean ± sd over seeds.",
        "- Rerun: the command above; `sinklab zoo --quick --out DIR` is a smoke version. "
        "Every number is in `zoo.json` and the table in `zoo.csv`.",
        "",
        "How \"zero\" is read off the weights, per head, at non-trigger rows "
        "(`sinklab.metrics.default_source`): a row is *off* when it sums to less than 0.2 of "
        "the trigger row's sum (possible only for rules whose rows need not sum to 1); an off "
        "row is a *closed gate* for gated attention, a *sink logit* for rules with an implicit "
        "sink key (the missing mass went there), a *zero row* otherwise. A row that is on is "
        "*BOS* when at least half of it is on BOS, else *content*. \"Sinks on BOS\" counts "
        "seeds with a head whose rows are on and hold at least 0.9 of their weight on BOS. "
        "For rules whose rows do not sum to 1 the Gu sink rate is also given in its relative "
        "(row-normalised) form.",
        "",
    ]
    for config in CONFIGS:
        lines += [f"## {config}", "", table(entries, config), ""]
    lines += [
        "## BOS ablation at evaluation",
        "",
        "The same trained models (chosen learning rate, every seed) evaluated on the test set "
        "with the BOS key hidden from every query but BOS's own (`model.bos=ablated`): test L∞ "
        "error at non-trigger and at trigger rows, intact -> ablated, mean over seeds.",
        "",
        ablation_table(entries),
        "",
        "## Which rules need a BOS sink",
        "",
        *_verdicts(entries),
        "",
        f"![where zero comes from]({prefix}/fig_zoo_sources.png)",
        "",
        f"![BOS mass and error per seed]({prefix}/fig_zoo_bos.png)",
        "",
    ]
    if result.get("extensions") is not None:
        from sinklab.experiments import extensions

        budget = (f"{result['seeds']} seed(s), the zoo's budget (at most "
                  f"{result['steps']['1x1']:,} steps for 1x1, {result['steps']['2x2']:,} for 2x2)")
        lines += extensions.render(result["extensions"], prefix, budget)
    return "\n".join(lines)


def verdict(runs: list[dict[str, Any]]) -> str:
    """Whether a rule needs a BOS sink, from its seeds at the chosen learning rate: only seeds
    that reached the stop rule count."""
    done = [r for r in runs if r["converged"]]
    if not done:
        return "no verdict (no seed reached the stop rule)"
    sinking = sum(r["sinks"] for r in done)
    if sinking == len(done):
        return f"sinks on BOS whenever it solves the task ({sinking}/{len(done)} solved seeds)"
    return (f"solves the task without a BOS sink ({len(done) - sinking}/{len(done)} solved "
            "seeds)")


def _verdicts(entries: list[dict[str, Any]]) -> list[str]:
    lines = []
    for rule in dict.fromkeys(e["rule"] for e in entries):
        parts = []
        for e in entries:
            if e["rule"] != rule:
                continue
            c = e["chosen"]
            chosen = [r for r in e["runs"] if r["lr"] == e["lr"]]
            main = max(c["sources"], key=lambda s: c["sources"][s]) if c["sources"] else "n/a"
            parts.append(f"{e['config']}: {verdict(chosen)}; converged {c['converged']}/"
                         f"{c['n']}; zero mostly from {main}")
        lines.append(f"- **{rule}** ({ROW_KIND[rule]} rows): " + "; ".join(parts) + ".")
    return lines

