"""The theory study's analysis: ``sinklab.studies.theory``'s ``Study`` names this module, and
the runner imports it when the study runs or renders.

``check`` (before anything is written), ``collect`` (the records, built by ``theory_records``),
``complete`` (the head claims' control, cheap to compute from the options), ``claims`` (from
``theory_claims``) and ``FIGURES``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ResultsError
from sinklab.runs import limits
from sinklab.studies import reproduce
from sinklab.studies.study import Context, Execution, FigureSpec
from sinklab.studies.theory import (
    GAPS,
    HEAD_FIGURE_SEEDS,
    HEAD_SEQUENCES,
    PLAIN_ATTACK_RESTARTS,
    PLAIN_SEQUENCES,
    QUICK_HEAD_SEQUENCES,
    QUICK_PLAIN_RESTARTS,
    QUICK_PLAIN_SEQUENCES,
    RELU_SIZES,
    RULES,
    TheoryOptions,
)
from sinklab.studies.theory_claims import claims
from sinklab.studies.theory_records import (
    check_reproduce,
    constant_share,
    denied_records,
    denied_settings,
    excursion,
    frontier_records,
    head_layers,
    head_records,
    head_rows,
    plain_collect,
    protocol,
    reproduction_runs,
    thresholds,
    worst_records,
)
from sinklab.theory import constructions as theory
from sinklab.theory.bounds import upper
from sinklab.theory.protocol import PLAIN_RULES
from sinklab.train import build_ensemble

__all__ = ["FIGURES", "check", "claims", "collect", "complete"]


# ------------------------------------------------------------------------------- check


def construction_bytes(opts: TheoryOptions) -> int:
    """Memory of the largest construction check (the ReLU construction's test set in float64,
    the softmax family's)."""
    sizes = [*RELU_SIZES, (opts.seq_len, opts.d_model)]
    return max([limits.forward_bytes(theory.construction_config("softmax", n, d), 256,
                                     itemsize=8) for n, d in sizes]
               + [limits.forward_bytes(theory.construction_config("softmax", opts.seq_len,
                                                                  opts.d_model), 2000,
                                       itemsize=8)])


def check(opts: TheoryOptions, exe: Execution, out: Path) -> None:
    """Before anything is written: the constructions fit in memory, --reproduce is usable and
    --out is not inside it (a study writes only into its own folder)."""
    limits.check_memory(construction_bytes(opts), f"checking the constructions at --seq-len "
                        f"{opts.seq_len} and --d-model {opts.d_model}")
    if opts.reproduce is not None:
        check_reproduce(opts.reproduce)
        rdir, target = Path(opts.reproduce).resolve(), Path(out).resolve()
        if target == rdir or rdir in target.parents:
            raise ResultsError(f"--out {out} is inside the --reproduce folder {opts.reproduce}, "
                               "which this study only reads; choose an --out outside it.")


# ----------------------------------------------------------------------------- records


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    ctx.log("theory: ReLU construction and softmax sink family")
    sizes = list(dict.fromkeys([*RELU_SIZES, (opts.seq_len, opts.d_model)]))
    relu = theory.relu_exactness(sizes)
    family = theory.family_sweep(list(GAPS), seq_len=opts.seq_len, d_model=opts.d_model)
    denied = denied_records(ctx)
    rdir, runs, source = reproduction_runs(ctx)
    ctx.log(f"theory: frontier and heads from the reproduction's runs in {rdir}")
    per_run, groups = frontier_records(rdir, runs)
    n_seq = QUICK_HEAD_SEQUENCES if source["quick"] else HEAD_SEQUENCES
    heads = head_records(rdir, runs, n_seq)
    for entry in heads:
        entry["constant_share"] = constant_share(entry)
        entry["excursion"] = excursion(entry)
    worst = worst_records(ctx)
    ctx.log("theory: where the plain-target stacks sink")
    n_plain = QUICK_PLAIN_SEQUENCES if opts.quick else PLAIN_SEQUENCES
    plain_restarts = QUICK_PLAIN_RESTARTS if opts.quick else PLAIN_ATTACK_RESTARTS
    plain = ctx.cached("plain", {"seeds": opts.seeds, "plain_steps": opts.plain_steps,
                                 "grid_seeds": opts.plain_grid_seeds, "sequences": n_plain,
                                 "attack_steps": opts.attack_steps,
                                 "restarts": plain_restarts},
                       lambda: plain_collect(ctx, opts.seeds, opts.plain_steps, n_plain,
                                             opts.plain_grid_seeds, opts.attack_steps,
                                             plain_restarts))
    return {
        "protocol": protocol(opts, ctx.exe), "thresholds": thresholds(),
        "worst": worst, "plain": plain,
        "reproduction": {**source, "head_sequences": n_seq},
        "relu_construction": relu, "family": family,
        "denied": denied, "denied_settings": denied_settings(denied),
        "frontier_runs": per_run, "frontier": groups,
        "heads": heads, "head_rows": head_rows(heads), "head_layers": head_layers(heads),
    }


def untrained_head_records(seeds: list[int], n_sequences: int, quick: bool
                           ) -> list[dict[str, Any]]:
    """``head_split`` of the reproduction's 4x4 softmax models at the paper's initialisation
    (``train.build_ensemble``: the weights the trained run of each seed started from), on the
    test sequences the trained ones are measured on; on the CPU, about 0.1 s a seed."""
    rep = reproduce.ReproduceOptions(seeds=max(seeds) + 1, quick=quick)
    out = []
    for seed in seeds:
        cfg = reproduce.run_config("4x4", "softmax", seed, rep, "cpu")
        model = build_ensemble([cfg], torch.device("cpu"))
        batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
        with torch.no_grad():
            entry = {"seed": seed, "step": 0, **theory.head_split(model, batch)}
        out.append({**entry, "constant_share": constant_share(entry),
                    "excursion": excursion(entry)})
    return out


def complete(records: dict[str, Any], opts: TheoryOptions) -> dict[str, Any]:
    """The records with the head claims' control added when absent: ``heads_untrained``, the
    untrained 4x4 softmax models of the seeds in ``heads`` (``untrained_head_records``)."""
    if not records.get("heads") or "heads_untrained" in records:
        return records
    rp = records["reproduction"]
    return {**records, "heads_untrained": untrained_head_records(
        [e["seed"] for e in records["heads"]], rp["head_sequences"], rp["quick"])}


# ----------------------------------------------------------------------------- figures

COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}
MARKERS = ("o", "s", "^", "v", "D")  # one per seed, cycling


def _draw_family(ax: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    fam = records["family"]
    pts = fam["points"]
    gap = [p["one_minus_bos"] for p in pts]
    for key, label, slope in (("linf_nontrigger", "L∞ error, non-trigger rows",
                               fam["slope_linf"]),
                              ("mse_nontrigger", "MSE, non-trigger rows", fam["slope_mse"])):
        ax.loglog(gap, [p[key] for p in pts], "o-", label=f"{label} (slope {slope:.2f})")
    for p in pts[::4]:
        ax.annotate(f"c={p['c']:g}", (p["one_minus_bos"], p["linf_nontrigger"]), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("1 - non-trigger BOS mass")
    ax.set_ylabel("error")
    ax.set_title("Softmax sink family: error falls only as BOS mass -> 1")
    ax.legend(fontsize=8)


def _experiments(records: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(g["experiment"] for g in records["frontier"]))


def _draw_frontier(axes: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    low = records["thresholds"]["frontier_low"]
    for row, experiment in enumerate(_experiments(records)):
        for col, (key, what) in enumerate((("bos_min", "min"), ("bos_max", "max"))):
            ax = axes[row, col]
            for rule in RULES:
                runs = [r for r in records["frontier_runs"]
                        if r["experiment"] == experiment and r["rule"] == rule]
                for i, run in enumerate(runs):
                    pts = run["points"]
                    ax.scatter([p["train_linf"] for p in pts], [p[key] for p in pts], s=5,
                               alpha=0.4, color=COLORS[rule], marker=MARKERS[i % len(MARKERS)],
                               label=f"{rule} ({len(runs)} seeds, a marker each)" if i == 0
                               else None)
            ax.axvline(low, color="grey", ls=":", linewidth=1)
            ax.axhline(SINK_HEAD_THRESHOLD, color="grey", ls="--", linewidth=1)
            ax.set_xscale("log")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("training-batch L∞ error at the checkpoint")
            ax.set_ylabel(f"{what} BOS mass over heads")
            ax.set_title(f"{experiment}: {what} over heads and layers", fontsize=9)
            ax.legend(fontsize=6, markerscale=2)


def _frontier_grid(records: dict[str, Any], opts: TheoryOptions) -> tuple[int, int]:
    return (len(_experiments(records)), 2)


def _drawn_heads(records: dict[str, Any]) -> list[dict[str, Any]]:
    return records["heads"][:HEAD_FIGURE_SEEDS]


def _draw_heads(axes: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    row = np.asarray(axes, dtype=object).reshape(1, -1)[0]  # one Axes when one seed is drawn
    for ax, entry in zip(row, _drawn_heads(records)):
        layers = entry["layers"]
        n_heads = len(layers[0]["heads"])
        width = 0.8 / (n_heads + 1)
        xs = np.arange(len(layers))
        for h in range(n_heads):
            const = [layer["heads"][h]["const"] for layer in layers]
            var = [layer["heads"][h]["var"] for layer in layers]
            ax.bar(xs + h * width, const, width, color="tab:blue",
                   label="head: constant" if h == 0 else None)
            ax.bar(xs + h * width, var, width * 0.45, color="tab:red",
                   label="head: variation" if h == 0 else None)
        ax.bar(xs + n_heads * width, [layer["cumulative"]["rms"] for layer in layers], width,
               color="grey", label="layers 1..l so far (RMS)")
        ax.set_xticks(xs + 0.4 - width / 2, [f"L{i + 1}" for i in range(len(layers))])
        ax.set_ylabel("RMS at non-trigger rows")
        ax.set_title(f"4x4 softmax, seed {entry['seed']}", fontsize=9)
        ax.legend(fontsize=6)


def _heads_grid(records: dict[str, Any], opts: TheoryOptions) -> tuple[int, int]:
    return (1, max(len(_drawn_heads(records)), 1))


KIND_STYLE = {"pre": "-", "post": "--", "trigger": ":"}


def draw_positions(axes: Any, records: dict[str, Any], opts: Any) -> None:
    """Per rule, seed 0's errors at every query position: sampled, attacked, certified."""
    for ax, rule in zip(np.ravel(axes), RULES):
        final = next((f for f in records["worst"]["finals"]
                      if f["rule"] == rule and f["seed"] == 0), None)
        if final is None:
            continue
        L = len(final["attacked"]["pre"])
        pos = np.arange(L)
        floor = 1e-12
        for kind, style in KIND_STYLE.items():
            for source, color in (("sampled", "tab:gray"), ("attacked", "tab:red")):
                vals = [np.nan if v is None else max(v, floor) for v in final[source][kind]]
                ax.plot(pos, vals, style, color=color, marker=".",
                        label=f"{source}, {kind}")
            cert = final.get("certified")
            if cert and kind != "trigger":
                up = [np.nan] * L
                for r in cert["rows"]:
                    if r["kind"] == kind:
                        up[r["i"]] = max(upper(r["upper"]), floor)
                ax.plot(pos, up, style, color="k", marker="_", label=f"certified, {kind}")
        ax.set_yscale("log")
        ax.set_xlabel("query position i")
        ax.set_ylabel("largest L∞ error at the row")
        ax.set_title(f"1x1 {rule}, seed 0" + (" (zero rows at 1e-12)" if rule == "relu"
                                               else ""), fontsize=9)
        ax.legend(fontsize=5, ncol=2)


def draw_necessity(axes: Any, records: dict[str, Any], opts: Any) -> None:
    """Left: error against 1 - BOS mass at X* for every checkpoint's pre rows and the family,
    with part 2's line for eps_T = nu = 0. Right: every checkpoint row's attacked error
    against its own part-2 bound (the allowed side is above the diagonal)."""
    left, right = np.ravel(axes)
    w = records["worst"]
    fam = [r for f in w["family"] for r in f["check"]["rows"]]
    ck = [r for c in w["checkpoints"] if c["rule"] == "softmax" for r in c["check"]["rows"]]
    vacuous = [r for r in ck if r["part2"] <= 0]
    for rows, label, style in (([r for r in ck if r["part2"] > 0],
                                "trained checkpoints (attacked)", "o"),
                               (vacuous, "trained checkpoints where part 2 is vacuous "
                                         "(eps_T + nu >= 1)", "x"),
                               (fam, "sink family (exact)", "s")):
        x = [1 - r["bos"] for r in rows if r["error"] > 0 and 1 - r["bos"] > 0]
        y = [r["error"] for r in rows if r["error"] > 0 and 1 - r["bos"] > 0]
        left.scatter(x, y, s=6, alpha=0.5, marker=style, label=label,
                     color="tab:gray" if rows is vacuous else None)
        if rows is vacuous:
            continue
        xs = [r["part2"] for r in rows if r["part2"] > 0]
        ys = [r["error"] for r in rows if r["part2"] > 0]
        right.scatter(xs, ys, s=6, alpha=0.5, marker=style, label=label)
    grid = np.logspace(-8, 0, 50)
    left.plot(grid, grid, "k--", label="bound, eps_T = nu = 0: 1 - b")
    right.plot(grid, grid, "k--", label="error = bound")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    left.set_xlabel("1 - BOS mass at X*, pre rows")
    left.set_ylabel("supremum error at the row (lower bound)")
    right.set_xlabel("the bound's value, part 2")
    right.set_ylabel("supremum error at the row (lower bound)")


def draw_norm(ax: Any, records: dict[str, Any], opts: Any) -> None:
    """Worst-case non-trigger error against ||W_Q W_K^T||_2."""
    w = records["worst"]
    floor = 1e-12
    fam = w["family"]
    ax.plot([f["norm"] for f in fam], [max(f["certified"], floor) for f in fam], "k-o", ms=3,
            label="softmax sink family (certified)")
    con = w["construction"]
    ax.scatter([con["norm"]], [max(con["certified"], floor)], marker="*", s=80,
               color="tab:green", label="ReLU construction (certified 0, drawn at 1e-12)")
    for rule in RULES:
        ck = [c for c in w["checkpoints"] if c["rule"] == rule]
        ax.scatter([c["norm"] for c in ck], [max(max(c["pre"] + [c["bos"]]), floor) for c in ck],
                   s=5, alpha=0.3, color=COLORS[rule],
                   label=f"{rule} checkpoints (attacked, pre rows)")
        fin = [f for f in w["finals"] if f["rule"] == rule and f.get("certified")]
        ax.scatter([f["norm"] for f in fin],
                   [max(upper(f["certified"]["upper"]), floor) for f in fin],
                   s=30, marker="D", edgecolor="k", color=COLORS[rule],
                   label=f"{rule} final models (certified)")
    ax.set_yscale("log")
    ax.set_xlabel("||W_Q W_K^T|| (spectral norm)")
    ax.set_ylabel("worst-case non-trigger L∞ error")
    ax.legend(fontsize=6)


def draw_denied(axes: Any, records: dict[str, Any], opts: Any) -> None:
    """Per rule: what the cap forces at row 1 by arithmetic, the attacked error at row 1, at
    the other non-trigger rows and at trigger rows, against eps (mean and range over seeds)."""
    tol = records["protocol"]["tol"]
    rows = records["worst"]["denied"]
    for ax, rule in zip(np.ravel(axes), RULES):
        sel = [r for r in rows if r["rule"] == rule and r["eps"] is not None]
        eps = sorted({r["eps"] for r in sel})
        for key, label, style in (("floor", "row 1: forced by arithmetic", "k--"),
                                  ("row1", "row 1: attacked", "o-"),
                                  ("others", "other non-trigger rows: attacked", "s-"),
                                  ("trigger", "trigger rows: attacked", "^-")):
            vals = [[max(r[key], 1e-12) for r in sel if r["eps"] == e] for e in eps]
            mean = np.array([np.mean(v) for v in vals])
            lo = np.array([np.min(v) for v in vals])
            hi = np.array([np.max(v) for v in vals])
            ax.errorbar(eps, mean, yerr=[mean - lo, hi - mean], fmt=style, capsize=3,
                        label=label, ms=4)
        ax.axhline(tol, color="grey", ls=":", label=f"stop rule ({tol:g})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("eps (BOS share capped at 1 - eps)")
        ax.set_ylabel("worst-case L∞ error")
        ax.set_title(f"1x1 {rule}", fontsize=9)
        ax.legend(fontsize=6)


def _runs(records: dict[str, Any]) -> list[dict[str, Any]]:
    return records["plain"]["runs"]


def _plain_experiments(records: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["experiment"] for r in _runs(records)))


def plain_grid(records: dict[str, Any], opts: Any) -> tuple[int, int]:
    """Rows: the experiments run; columns: the rules."""
    return (max(len(_plain_experiments(records)), 1), len(PLAIN_RULES))


def draw_plain(axes: Any, records: dict[str, Any], opts: Any) -> None:
    """Per experiment (row) and rule (column), a line per seed: the largest non-trigger BOS
    mass over every head and layer at each query position, with the sink threshold dashed."""
    grid = np.asarray(axes, dtype=object).reshape(-1, len(PLAIN_RULES))
    for row, e in zip(grid, _plain_experiments(records)):
        for ax, rule in zip(row, PLAIN_RULES):
            sel = [r for r in _runs(records) if r["experiment"] == e and r["rule"] == rule]
            for r in sel:
                top = r["bos_max_by_position"]
                pos = [i for i, v in enumerate(top) if v is not None]
                ax.plot(pos, [top[i] for i in pos], marker="o", markersize=3, linewidth=1,
                        alpha=0.8 if r["converged"] else 0.4,
                        linestyle="-" if r["converged"] else ":")
            ax.axhline(SINK_HEAD_THRESHOLD, color="grey", ls="--", linewidth=1,
                       label=f"sink threshold {SINK_HEAD_THRESHOLD:g}")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("query position (0-indexed), non-trigger rows")
            ax.set_ylabel("largest BOS mass over heads")
            n_conv = sum(r["converged"] for r in sel)
            ax.set_title(f"plain {e} {rule}: {len(sel)} seeds, {n_conv} reached the stop "
                         "rule (solid)", fontsize=9)
            ax.legend(fontsize=7)


PLAIN_FIGURES = (
    FigureSpec("fig_plain", draw_plain, grid=plain_grid, size=(5.0, 3.2),
               title="Plain targets (no residual stream): where the stack sinks",
               when=lambda records, opts: bool(records.get("plain", {}).get("runs"))),
)
FIGURES = (
    FigureSpec("fig_family", _draw_family, size=(6.0, 4.2)),
    FigureSpec("fig_worst", draw_positions, grid=(1, 2), size=(5.5, 4.0),
               title="Sampled, attacked and certified errors per position"),
    FigureSpec("fig_necessity", draw_necessity, grid=(1, 2), size=(5.5, 4.2),
               title="The necessity bound, checked at every checkpoint and along the family"),
    FigureSpec("fig_norm", draw_norm, size=(6.5, 4.5)),
    FigureSpec("fig_denied", draw_denied, grid=(1, 2), size=(5.5, 4.0),
               title="Denied sink, 1x1: worst-case errors, mean and range over seeds"),
    FigureSpec("fig_frontier", _draw_frontier, grid=_frontier_grid, size=(5.0, 3.2)),
    FigureSpec("fig_heads", _draw_heads, grid=_heads_grid, size=(4.0, 3.6),
               when=lambda records, opts: bool(records["heads"])),
    *PLAIN_FIGURES,
)
