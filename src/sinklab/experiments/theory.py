"""``sinklab theory``: the theorem checked numerically, with every number in ``theory.json``.

Writes into the output folder::

    denied/{rule}_{setting}_seed{s}/   training runs with the sink denied (config, metrics, summary)
    reproduce/                         a default reproduction, unless --reproduce names one
    figures/                           the family, denied-sink, frontier and head figures
    theory.json                        every number behind the figures
    THEORY.md                          the "Theory" section, linked from the reproduce report

Rerunning with the same ``--out`` keeps every finished training run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from matplotlib.figure import Figure

from sinklab import folders, limits, plots, report, theory
from sinklab.config import ConfigError, check_count
from sinklab.experiments import reproduce as rep
from sinklab.results import ResultsError, read_json, read_metrics, write_atomic, write_json
from sinklab.train import load_model, resolve_device, versions

# the report's first line (--docs checks it)
TITLE = "# Theory: the sink is necessary for softmax, and not for ReLU"
RULES = ("softmax", "relu")
GAPS = tuple(float(c) for c in range(0, 17))  # logit gaps of the softmax sink family
RELU_SIZES = ((4, 4), (5, 7), (16, 16), (33, 12), (64, 32), (128, 64))  # (seq_len, d_model)
DENIED_STEPS = 3000  # about 4x the steps a 1x1 model needs with its sink
QUICK_DENIED_STEPS = 1200


@dataclass
class TheoryOptions(rep.RunOptions):
    """What ``sinklab theory`` runs; every value is checked on creation."""

    steps: int | None = None  # denied-sink step budget; None: 3000, or 1200 with quick
    eps: tuple[float, ...] = field(default=theory.DENIED_EPS)
    reproduce: Path | None = None  # a finished reproduce folder; None: train one in out
    seq_len: int = 16  # size of the softmax family, and one more size for the ReLU check
    d_model: int = 16
    quick_seeds: ClassVar[int] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for flag, value in (("--seq-len", self.seq_len), ("--d-model", self.d_model)):
            if not (isinstance(value, int) and value >= 4):
                raise ConfigError(f"{flag}={value!r} is not allowed: the constructions need "
                                  "an integer >= 4 (BOS, trigger, content and bias flag).")
        if self.steps is None:
            self.steps = QUICK_DENIED_STEPS if self.quick else DENIED_STEPS
        check_count("--steps", self.steps)
        if not self.eps:
            raise ConfigError("--eps needs at least one value in (0, 1).")
        for eps in self.eps:
            if not 0 < eps < 1:
                raise ConfigError(f"--eps value {eps!r} is not allowed: every eps must lie in "
                                  "(0, 1), the BOS share being capped at 1 - eps.")
        if len(set(self.eps)) != len(self.eps):
            twice = next(e for e in self.eps if self.eps.count(e) > 1)
            raise ConfigError(f"--eps lists {twice!r} twice; give each cap once.")

    def runs_per_seed(self) -> int:
        own = len(RULES) * len(theory.denied_settings(self.eps))
        return own + (len(rep.EXPERIMENTS) * len(rep.RULES) if self.reproduce is None else 0)


def parse_eps(text: str) -> tuple[float, ...]:
    """``"0.01,0.1"`` -> (0.01, 0.1); a value that is not a number is a ConfigError."""
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--eps {text!r} is not allowed: give numbers in (0, 1) separated by "
                          "commas, for example 0.01,0.1,0.5.") from None


# ------------------------------------------------------------------------------ denied sinks


def denied_dir(out: Path, rule: str, setting: str, seed: int) -> Path:
    return out / "denied" / f"{rule}_{setting}_seed{seed}"


def denied_jobs(out: Path, opts: TheoryOptions) -> tuple[list[rep.Job], int]:
    """The denied-sink training jobs still to run (one ensemble of seeds per setting)."""
    jobs, done = [], 0
    for rule in RULES:
        for setting, eps in theory.denied_settings(opts.eps):
            todo = []
            for seed in range(opts.seeds):
                cfg = theory.denied_config(rule, setting, eps, seed, opts.steps, opts.device)
                path = denied_dir(out, rule, setting, seed)
                if rep.is_finished(path, cfg):
                    done += 1
                else:
                    todo.append((cfg, path))
            if todo:
                jobs.append(rep.Job("1x1", rule, [c for c, _ in todo], [p for _, p in todo],
                                    tag=setting))
    return jobs, done


def denied_results(out: Path, opts: TheoryOptions) -> list[dict[str, Any]]:
    rows = []
    for rule in RULES:
        for setting, eps in theory.denied_settings(opts.eps):
            for seed in range(opts.seeds):
                path = denied_dir(out, rule, setting, seed)
                summary = read_json(path / "summary.json")
                rows.append({
                    "rule": rule, "setting": setting, "eps": eps, "seed": seed,
                    "converged": summary["converged"], "status": summary["status"],
                    "steps": summary["steps"], "eval_linf": summary["linf_error"],
                    "eval_mse": summary["mse"],
                    "bos_mass_nontrigger": summary["bos_mass_nontrigger"][0][0],
                    **theory.floor(read_metrics(path / "metrics.jsonl")),
                })
    return rows


# --------------------------------------------------------------------- frontier and heads


def reproduce_runs(rdir: Path) -> list[dict[str, Any]]:
    """The runs of a finished reproduce folder, each checked against its completion record."""
    path = rdir / "summary.json"
    if not path.is_file():
        raise ResultsError(f"{rdir} is not a finished reproduce folder ({path} is missing): run "
                           f"`sinklab reproduce --out {rdir}` first, or leave out --reproduce.")
    summary = read_json(path)
    if not isinstance(summary, dict) or not isinstance(summary.get("runs"), list):
        raise ResultsError(f"{path} is not a reproduce summary (it has no list of runs).")
    for run in summary["runs"]:
        folder = rep.run_dir(rdir, run["experiment"], run["attention"], run["seed"])
        if not folders.check_complete(folder):
            raise ResultsError(f"{folder} has not finished; run `sinklab reproduce --out {rdir}` "
                               "again to finish it.")
    return summary["runs"]


def frontier(rdir: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Checkpoints of every reproduce run as (error, BOS mass), grouped by experiment and rule."""
    groups: dict[str, Any] = {}
    for run in runs:
        path = rep.run_dir(rdir, run["experiment"], run["attention"], run["seed"])
        points = theory.frontier_points(read_metrics(path / "metrics.jsonl"))
        key = f"{run['experiment']} {run['attention']}"
        group = groups.setdefault(key, {"experiment": run["experiment"],
                                        "rule": run["attention"], "seeds": {}})
        group["seeds"][str(run["seed"])] = points
    for group in groups.values():
        every = [p for pts in group["seeds"].values() for p in pts]
        group["summary"] = theory.frontier_summary(every)
    return groups


def heads(rdir: Path, runs: list[dict[str, Any]], n_sequences: int) -> list[dict[str, Any]]:
    """Per-head contributions at non-trigger rows of every 4x4 softmax reproduce model."""
    found = []
    for run in runs:
        if run["experiment"] != "4x4" or run["attention"] != "softmax":
            continue
        cfg, model = load_model(rep.run_dir(rdir, "4x4", "softmax", run["seed"]))
        batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
        found.append({"seed": run["seed"], "converged": run["converged"],
                      "layers": theory.head_contributions(model, batch)})
    return found


# ---------------------------------------------------------------------------------- run


def run_theory(out: Path, opts: TheoryOptions, *, log: Callable[[str], None] | None = None,
               docs: Path | None = None, command: str | None = None) -> dict[str, Any]:
    """Run (or resume) every theory experiment in ``out``; write theory.json, figures, THEORY.md.

    ``out`` is claimed and locked; so is the ``--reproduce`` folder, whose report gains a link
    to the theory section (no other process may write it meanwhile).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    rep.check_docs(docs, TITLE)
    if opts.reproduce is not None:  # fail before any work, with the reason
        rdir = Path(opts.reproduce)
        if rdir.exists() and not rdir.is_dir():
            raise ResultsError(f"--reproduce {rdir} is a file, not a reproduce folder.")
        if rdir.is_dir() and folders.kind_of(rdir) != "reproduce":
            raise ResultsError(f"--reproduce {rdir} is not a sinklab reproduce folder (its "
                               f"{folders.MARKER} does not say so).")
        reproduce_runs(rdir)
    limits.check_memory(construction_bytes(opts), f"checking the constructions at --seq-len "
                        f"{opts.seq_len} and --d-model {opts.d_model}")
    with opts.session(), folders.writing(out, "theory"), ExitStack() as held:
        if opts.reproduce is not None:
            held.enter_context(folders.hold(Path(opts.reproduce)))
        return _run_theory(out, opts, log, docs, command)


def construction_bytes(opts: TheoryOptions) -> int:
    """Memory of the largest construction check (the softmax family's test set in float32,
    the ReLU construction's in float64)."""
    sizes = [*RELU_SIZES, (opts.seq_len, opts.d_model)]
    return max([limits.forward_bytes(theory.construction_config("softmax", n, d), 256,
                                     itemsize=8) for n, d in sizes]
               + [limits.forward_bytes(theory.construction_config("softmax", opts.seq_len,
                                                                  opts.d_model), 2000)])


def _run_theory(out: Path, opts: TheoryOptions, log: Callable[[str], None], docs: Path | None,
                command: str | None) -> dict[str, Any]:
    start = time.perf_counter()

    log("theory: ReLU construction and softmax sink family")
    sizes = list(dict.fromkeys([*RELU_SIZES, (opts.seq_len, opts.d_model)]))
    relu = theory.relu_exactness(sizes)
    family = theory.family_sweep(list(GAPS), seq_len=opts.seq_len, d_model=opts.d_model)

    jobs, done = denied_jobs(out, opts)
    workers = rep.worker_count(opts.workers, resolve_device(opts.device), len(jobs))
    n_runs = sum(len(j.configs) for j in jobs)
    log(f"theory: {n_runs} denied-sink runs to train in {len(jobs)} jobs on {workers} "
        f"worker(s); {done} already finished")
    rep.run_all(jobs, workers, log, out, opts)
    denied = denied_results(out, opts)

    if opts.reproduce is None:
        rdir = out / "reproduce"
        log(f"theory: the trained models come from a reproduction in {rdir}")
        rep.reproduce(rdir, rep.ReproduceOptions(seeds=opts.seeds, quick=opts.quick,
                                                 workers=opts.workers, device=opts.device,
                                                 executor=opts.executor,
                                                 ray_address=opts.ray_address),
                      log=log)
    else:
        rdir = Path(opts.reproduce)
    runs = reproduce_runs(rdir)
    front = frontier(rdir, runs)
    head_rows = heads(rdir, runs, n_sequences=200 if opts.quick else 1000)
    wall = time.perf_counter() - start

    result = {
        "command": command or f"sinklab theory --out {out}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_time_s": wall, "versions": versions(), "quick": opts.quick,
        "seeds": opts.seeds, "denied_steps": opts.steps, "eps": list(opts.eps),
        "reproduce": str(rdir),
        "relu_construction": relu, "softmax_family": family, "denied": denied,
        "frontier": front, "heads_4x4_softmax": head_rows,
        "heads_summary": theory.head_summary(head_rows) if head_rows else None,
    }
    write_json(out / "theory.json", result)
    figures = write_figures(out, result)
    write_atomic(out / "THEORY.md", render(result, "figures").encode())
    # the reproduction inside out has a lock of its own, taken again here; a --reproduce
    # folder's is held already (run_theory)
    with folders.hold(rdir) if opts.reproduce is None else nullcontext():
        rep.link_theory(rdir, out / "THEORY.md")
    if docs is not None:
        rep.copy_to_docs(Path(docs), figures, lambda prefix: render(result, prefix))
    log(f"theory: wrote {out / 'THEORY.md'} ({wall:.0f} s)")
    return result


# -------------------------------------------------------------------------------- figures

COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}
MARKERS = ("o", "s", "^", "v", "D")  # one per seed


def write_figures(out: Path, result: dict[str, Any]) -> list[Path]:
    folder = out / "figures"
    paths = [folder / name for name in ("fig_family.png", "fig_denied.png", "fig_frontier.png",
                                         "fig_heads.png")]
    plots.save_figure(family_figure(result["softmax_family"]), paths[0])
    plots.save_figure(denied_figure(result["denied"]), paths[1])
    plots.save_figure(frontier_figure(result["frontier"]), paths[2])
    if result["heads_4x4_softmax"]:
        plots.save_figure(heads_figure(result["heads_4x4_softmax"]), paths[3])
    else:
        paths.pop()
    return paths


def family_figure(family: dict[str, Any]) -> Figure:
    pts = family["points"]
    gap = np.array([p["one_minus_bos"] for p in pts])
    fig = Figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    for key, label, slope in (("linf_nontrigger", "L∞ error, non-trigger rows",
                               family["slope_linf"]),
                              ("mse_nontrigger", "MSE, non-trigger rows", family["slope_mse"])):
        ax.loglog(gap, [p[key] for p in pts], "o-", label=f"{label} (slope {slope:.2f})")
    for p in pts[::4]:
        ax.annotate(f"c={p['c']:g}", (p["one_minus_bos"], p["linf_nontrigger"]), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("1 - non-trigger BOS mass")
    ax.set_ylabel("error")
    ax.set_title("Softmax sink family: error falls only as BOS mass -> 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _by_setting(denied: list[dict[str, Any]], rule: str, key: str) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for row in denied:
        if row["rule"] == rule:
            groups.setdefault(row["setting"], []).append(row[key])
    return groups


def denied_figure(denied: list[dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(11, 4))
    for i, (key, label) in enumerate((("best_linf", "best L∞ error (train batches)"),
                                      ("best_mse", "best MSE (train batches)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for rule in RULES:
            groups = _by_setting(denied, rule, key)
            eps = sorted({r["eps"] for r in denied if r["eps"] is not None})
            mean = [np.mean(groups[f"capped-{e:g}"]) for e in eps]
            lo = [np.min(groups[f"capped-{e:g}"]) for e in eps]
            hi = [np.max(groups[f"capped-{e:g}"]) for e in eps]
            ax.errorbar(eps, mean, yerr=[np.subtract(mean, lo), np.subtract(hi, mean)],
                        fmt="o-", color=COLORS[rule], capsize=3,
                        label=f"{rule}, BOS share capped at 1 - eps")
            removed = groups["removed"]
            ax.axhline(float(np.mean(removed)), color=COLORS[rule], ls="--",
                       label=f"{rule}, BOS key removed")
        if key == "best_linf":
            ax.axhline(5e-3, color="grey", ls=":", label="stop rule (5e-3)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("eps")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("Denied sink, 1x1: mean and range over seeds")
    fig.tight_layout()
    return fig


def frontier_figure(front: dict[str, Any]) -> Figure:
    experiments = sorted({g["experiment"] for g in front.values()})
    fig = Figure(figsize=(10, 3.2 * len(experiments)))
    for row, experiment in enumerate(experiments):
        for col, (key, what) in enumerate((("bos_min", "min"), ("bos_max", "max"))):
            ax = fig.add_subplot(len(experiments), 2, 2 * row + col + 1)
            for rule in RULES:
                group = front.get(f"{experiment} {rule}")
                if group is None:
                    continue
                for i, (seed, pts) in enumerate(group["seeds"].items()):
                    ax.scatter([p["linf"] for p in pts], [p[key] for p in pts], s=5, alpha=0.4,
                               color=COLORS[rule], marker=MARKERS[i % len(MARKERS)],
                               label=f"{rule}, seed {seed}")
            ax.set_xscale("log")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("batch L∞ error at the checkpoint")
            ax.set_ylabel(f"{what} BOS mass over heads")
            ax.set_title(f"{experiment}: {what} over heads and layers", fontsize=9)
            ax.legend(fontsize=6, markerscale=2, ncol=2)
    fig.tight_layout()
    return fig


def heads_figure(head_rows: list[dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(4 * len(head_rows), 3.6))
    for i, entry in enumerate(head_rows):
        ax = fig.add_subplot(1, len(head_rows), i + 1)
        layers = entry["layers"]
        n_heads = len(layers[0]["heads"])
        width = 0.8 / (n_heads + 2)
        xs = np.arange(len(layers))
        for h in range(n_heads):
            ax.bar(xs + h * width, [lay["heads"][h]["post_norm"] for lay in layers], width,
                   label=f"head {h + 1}")
        ax.bar(xs + n_heads * width, [lay["sum_norm_nontrigger"] for lay in layers], width,
               color="black", label="sum of heads")
        ax.bar(xs + (n_heads + 1) * width, [lay["cumulative_norm_nontrigger"] for lay in layers],
               width, color="grey", label="layers 1..l so far")
        ax.set_xticks(xs + 0.4 - width / 2, [f"L{i + 1}" for i in range(len(layers))])
        ax.set_ylabel("mean norm at non-trigger rows")
        ax.set_title(f"4x4 softmax, seed {entry['seed']}", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------- report


def _denied_table(denied: list[dict[str, Any]]) -> str:
    rows = []
    for rule in RULES:
        settings = list(dict.fromkeys(r["setting"] for r in denied if r["rule"] == rule))
        for setting in settings:
            sel = [r for r in denied if r["rule"] == rule and r["setting"] == setting]
            rows.append([rule, setting, f"{sum(r['converged'] for r in sel)}/{len(sel)}",
                         report.spread([r["best_linf"] for r in sel], 4),
                         report.spread([r["best_mse"] for r in sel], 6),
                         report.spread([r["eval_linf"] for r in sel], 4),
                         report.spread([r["bos_mass_nontrigger"] for r in sel], 3)])
    return report.table(["rule", "sink", "reached stop rule", "best train L∞", "best train MSE",
                         "final test L∞", "non-trigger BOS mass"], rows)


def _frontier_table(front: dict[str, Any]) -> str:
    rows = []
    for key, group in front.items():
        summary = group["summary"]
        cells = []
        for band in summary["bands"]:
            if band["n"]:
                cells.append(f"{band['bos_min']:.2f} / {band['bos_max']:.2f} ({band['n']})")
            else:
                cells.append("-")
        rows.append([key, summary["n_checkpoints"], *cells,
                     report.fixed(summary["bos_max_overall"]),
                     report.fixed(summary["spearman_error_vs_one_minus_max_bos"])])
    bands = [f"L∞ {b[0]:g}-{b[1]:g}".replace("-inf", "+") for b in theory.ERROR_BINS]
    return report.table(["runs", "checkpoints", *bands, "largest max BOS",
                         "rank corr. (error, 1 - max BOS)"], rows)


def _heads_table(head_rows: list[dict[str, Any]]) -> str:
    rows = []
    for entry in head_rows:
        for li, layer in enumerate(entry["layers"]):
            heads = layer["heads"]
            rows.append([entry["seed"], f"L{li + 1}",
                         " / ".join(f"{h['bos_mass_nontrigger']:.2f}" for h in heads),
                         " / ".join(f"{h['pre_norm']:.3f}" for h in heads),
                         " / ".join(f"{h['post_norm']:.3f}" for h in heads),
                         f"{layer['sum_of_head_norms_nontrigger']:.3f}",
                         f"{layer['sum_norm_nontrigger']:.3f}",
                         f"{layer['sum_norm_trigger']:.3f}",
                         f"{layer['cumulative_norm_nontrigger']:.3f}",
                         f"{layer['cumulative_norm_trigger']:.3f}"])
    return report.table(["seed", "layer", "BOS mass per head", "norm before W_O per head",
                         "norm after W_O per head", "sum of head norms", "norm of the sum",
                         "norm of the sum, trigger rows", "layers 1..l so far",
                         "layers 1..l so far, trigger rows"], rows)


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _denied_text(denied: list[dict[str, Any]]) -> list[str]:
    """What the denied-sink table shows, computed from it."""
    lines = []
    for rule in RULES:
        sel = [r for r in denied if r["rule"] == rule]
        reached = sum(r["converged"] for r in sel)
        caps = sorted({r["eps"] for r in sel if r["eps"] is not None})
        floors = [_mean([r["best_linf"] for r in sel if r["eps"] == e]) for e in caps]
        removed = _mean([r["best_linf"] for r in sel if r["setting"] == "removed"])
        rising = all(a < b for a, b in zip(floors, floors[1:]))
        text = (f"- {rule}: {reached} of {len(sel)} runs reached the stop rule. Best L∞ with "
                f"BOS removed {removed:.3g}; with the cap, "
                + ", ".join(f"{f:.3g} at eps {e:g}" for e, f in zip(caps, floors)) + ".")
        if reached < len(sel) and caps:
            text += (" The floor " + ("rises" if rising else "does not rise monotonically")
                     + " with eps; best L∞ / eps: "
                     + ", ".join(f"{f / e:.2g}" for e, f in zip(caps, floors)) + ".")
        lines.append(text)
    return [*lines, ""]


def _frontier_text(front: dict[str, Any]) -> list[str]:
    lines = []
    for key, group in front.items():
        low = group["summary"]["bands"][-1]
        if low["n"]:
            lines.append(f"- {key}: at the {low['n']} checkpoints with L∞ below 0.01 the most "
                         f"sinking head has BOS mass {low['bos_max']:.3f} on average (the "
                         f"least sinking {low['bos_min']:.3f}); largest at any checkpoint "
                         f"{report.fixed(group['summary']['bos_max_overall'], 3)}.")
        else:
            lines.append(f"- {key}: no checkpoint below L∞ 0.01; largest max BOS mass "
                         f"{report.fixed(group['summary']['bos_max_overall'], 3)}.")
    return [*lines, ""]


def _heads_text(summary: dict[str, Any] | None) -> list[str]:
    """The answer the head numbers give, stated with the numbers."""
    if not summary or summary["w_o_ratio_not_sink"] is None:
        return []
    r_not, r_sink = summary["w_o_ratio_not_sink"], summary["w_o_ratio_sink"]
    nulled = r_sink is not None and r_not < 0.5 * r_sink
    within = summary["within_layer"]
    final, per_layer = summary["final_cumulative"], summary["layer_sum_mean"]
    return [
        f"What the numbers show: W_O keeps {r_not:.2f} of the norm of the "
        f"{summary['n_not_sink_heads']} heads whose BOS mass is below 0.5 and "
        f"{report.fixed(r_sink)} of the {summary['n_sink_heads']} sink heads (BOS mass >= 0.9), "
        + ("so it does damp the heads that do not sink more than the others. "
           if nulled else "so it does not single out the heads that do not sink: it does not "
           "null them. ")
        + f"Within a layer the heads' sum has {within:.2f} of the summed norms of its heads "
        + ("(partial cancellation between heads). " if within < 0.9 else "(little cancellation). ")
        + f"A layer still adds {per_layer:.3f} on average at non-trigger rows, while all layers "
        f"together leave {final:.3f} there (the error): "
        + ("the layers' additions cancel each other along the residual stream."
           if final < 0.5 * per_layer else "most of what the layers add is not cancelled."),
        "",
    ]


def render(result: dict[str, Any], prefix: str) -> str:
    """The Theory section as Markdown; figure links start with ``prefix``."""
    fam = result["softmax_family"]
    relu = result["relu_construction"]
    f32 = [r for r in relu if r["dtype"] == "float32"]
    f64 = [r for r in relu if r["dtype"] == "float64"]
    pts = fam["points"]
    sizes = ", ".join(f"({a}, {b})" for a, b in dict.fromkeys(
        (r["seq_len"], r["d_model"]) for r in relu))
    v = result["versions"]
    lines = [
        TITLE,
        "",
        f"- Written by: `{result['command']}` on {result['date']} in "
        f"{result['wall_time_s']:.0f} s"
        + (" (**quick mode**: short budgets, not the documented numbers)" if result["quick"]
           else ""),
        f"- Versions: sinklab {v['sinklab']}, torch {v['torch']}, Python {v['python']}",
        f"- Trained models: the reproduction in `{result['reproduce']}`",
        "- Rerun: the command above (`make docs` for the committed copy in docs/theory.md); "
        "`sinklab theory --quick --out DIR` is a one-minute smoke version. Every number below "
        "is in `theory.json`.",
        "",
        "## 1. An exact ReLU solution with no sink",
        "",
        "Weights written down by hand (`sinklab.theory.relu_construction`): only the trigger "
        "row has a non-zero query, every token but BOS has the same key, so ReLU(S) / j puts "
        "1/j on x_1..x_j at the trigger row and nothing anywhere else; W_V = W_O = I. In the "
        "2x2 residual version the construction sits in layer 1, head 1 and every other head "
        "is zero.",
        "",
        f"Checked on random sequences with every trigger position, for (seq_len, d_model) in "
        f"{sizes}, 1x1 and 2x2: largest error "
        f"{max(r['linf'] for r in f32):.2e} in float32 and {max(r['linf'] for r in f64):.2e} "
        f"in float64; largest BOS weight at any row: "
        f"{max(r['bos_weight_max'] for r in relu):g}.",
        "",
        "## 2. The softmax sink family",
        "",
        f"Softmax weights with a logit gap c (`sinklab.theory.softmax_sink`), seq_len "
        f"{fam['seq_len']}, d_model {fam['d_model']}: non-trigger rows "
        "score BOS c above the content, the trigger row scores the content c above BOS, and "
        "BOS's value is 0. At a non-trigger row i the output is exactly (1 - BOS mass) times "
        "the mean of x_1..x_i.",
        "",
        f"![error against 1 - BOS mass]({prefix}/fig_family.png)",
        "",
        report.table(["c", "non-trigger BOS mass", "L∞ error (non-trigger rows)",
                      "MSE (non-trigger rows)", "L∞ error (trigger rows)"],
                     [[f"{p['c']:g}", f"{1 - p['one_minus_bos']:.6f}",
                       report.sci(p["linf_nontrigger"]), report.sci(p["mse_nontrigger"]),
                       report.sci(p["linf_trigger"])] for p in pts[::2]]),
        "",
        f"Fitted log-log slopes against 1 - BOS mass over c = {pts[0]['c']:g}..{pts[-1]['c']:g}: "
        f"L∞ error {fam['slope_linf']:.2f}, MSE {fam['slope_mse']:.2f}. The error falls in "
        "proportion to the mass that is not on BOS, never faster.",
        "",
        "Why softmax cannot beat this trade-off. A softmax row is a probability distribution "
        "over the keys it sees, so at a non-trigger row the output is a weighted average of "
        "value vectors with weights summing to 1. To output zero for *every* input, the "
        "average must not depend on the content, so the weight has to sit on keys whose value "
        "does not depend on the content either. In this task the only such key is BOS: every "
        "other token carries fresh random content. Whatever weight 1 - b is left off BOS "
        "multiplies vectors that change from input to input, and the output moves with them "
        "in proportion to 1 - b; weights that average random vectors can shrink the result "
        "only so far, and the task's freely chosen inputs include ones where it does not "
        "shrink at all. So the worst-case error at those rows is at least a constant times "
        "1 - b, and reaching error 0 needs b = 1, which softmax attains only in the limit of "
        "infinite logit gaps: the sink is not a training accident but the only way down. The "
        "family above attains the bound with slope 1, so it is the best trade-off up to the "
        "constant. ReLU escapes because its rows need not sum to 1: an all-zero row outputs "
        "zero exactly (section 1).",
        "",
        "## 3. Denying the sink",
        "",
        f"1x1 models trained with the paper's protocol for at most {result['denied_steps']:,} "
        f"steps, {result['seeds']} seeds each, with BOS removed from every non-trigger query's "
        "keys, or with every non-trigger row's BOS share capped at 1 - eps "
        f"(eps in {', '.join(f'{e:g}' for e in result['eps'])}); the cap moves the excess to "
        "the row's other keys in proportion, so softmax rows still sum to 1. Best values "
        "over the logged training batches (every 50 steps) and the final test error "
        "(trigger at position 7), mean ± sd over seeds:",
        "",
        _denied_table(result["denied"]),
        "",
        *_denied_text(result["denied"]),
        f"![denied sink]({prefix}/fig_denied.png)",
        "",
        "## 4. The error-BOS frontier of trained models",
        "",
        "Every logged checkpoint of the reproduction's runs (every 100 steps and the last), as "
        "(batch L∞ error, non-trigger BOS mass), with the minimum and the maximum over heads "
        "and layers. Table cells: mean min / mean max BOS mass of the checkpoints in each "
        "error band (their number). The theorem is existential: it needs *some* head to sink, "
        "so the maximum over heads is the quantity it constrains.",
        "",
        _frontier_table(result["frontier"]),
        "",
        *_frontier_text(result["frontier"]),
        f"![frontier]({prefix}/fig_frontier.png)",
        "",
    ]
    if result["heads_4x4_softmax"]:
        lines += [
            "## 5. Why the heads that do not sink are harmless (4x4 softmax)",
            "",
            "Per head, at non-trigger rows of random sequences: the non-trigger BOS mass, the "
            "mean norm of A_h z W_V^h (before W_O) and of the head's contribution A_h z W_V^h "
            "W_O^h (after), and per layer the norm of the sum of the heads' contributions (at "
            "trigger rows too, for scale) and the norm of everything layers 1..l have added "
            "to the residual stream so far. The target at a non-trigger row is x itself, so "
            "the last layer's cumulative norm at non-trigger rows is the error there.",
            "",
            _heads_table(result["heads_4x4_softmax"]),
            "",
            *_heads_text(result["heads_summary"]),
            f"![head contributions]({prefix}/fig_heads.png)",
            "",
        ]
    return "\n".join(lines)
