"""What the theory study concludes from its records, and the numbers of its protocol, without
torch: the claims and figures of its worst-case, necessity, denied-sink and plain-stack sections
(their measurements are ``bounds`` and ``stacks``), and the settings its options, help texts and
those measurements name. ``sinklab.studies.theorem`` declares the study with them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.definitions import SINK_HEAD_THRESHOLD

# ---------------------------------------------------------------------------- protocol

DENIED_EPS = (0.01, 0.03, 0.1, 0.3, 0.5)  # BOS share caps 1 - eps of the denied-sink study
# The plateau rule of every run the theory study trains to a plateau (denied sinks, plain stacks):
# a run stops when its training-batch L-infinity error has set no new best for this many steps
# (``train.patience``), or at its step cap.
# The plateau rule of every run the theory study trains to a plateau (denied sinks, plain stacks):
# a run stops when its training-batch L-infinity error has set no new best for this many steps
# (``train.patience``), or at its step cap.
PLATEAU_PATIENCE = 2000
ERROR_BINS = ((1.0, math.inf), (0.1, 1.0), (0.01, 0.1), (0.0, 0.01))
RULES = ("softmax", "relu")
SAMPLED = 2000  # test sequences of the sampled errors (every trigger position)
UNDERSTATES = 2.0  # "the sample understates the worst case": attacked / sampled at least this
FACTOR = 2.0  # the certified upper bound within this factor of the attack's lower bound
STRONGER = 1.1  # the bound made this much stronger must be violated somewhere
CHECKPOINT_RESTARTS = 2  # random starts per row of the cheap attack at every checkpoint
ROUNDING = 1e-12  # relative: a bound and an error computed along two float64 paths may differ
PLAIN_EXPERIMENTS = ("2x2", "4x4")
PLAIN_RULES = ("softmax", "relu")
PLAIN_LOG_EVERY = 100
PLAIN_LR = 1e-3  # the plain stacks' learning rate (the paper's 1x1 rate)
PLAIN_SEQUENCES, QUICK_PLAIN_SEQUENCES = 1000, 200  # test sequences of the BOS measurements
# How a run can end (``sinklab.train``): the stop rule, the plateau rule, the step cap, NaN.
# How a run can end (``sinklab.train``): the stop rule, the plateau rule, the step cap, NaN.
STOPS = ("converged", "plateau", "max_steps", "diverged")


# ---------------------------------------------------------------- worst case and necessity


def finite(values: list[Any]) -> list[float]:
    """The values that are numbers and finite (None and NaN mark a row type or a run that has
    none), as floats."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def nontrigger(errors: dict[str, list[float | None]]) -> float:
    """The largest non-trigger error (BOS, pre and post rows) of a kind -> positions table."""
    return max(finite(errors["bos"] + errors["pre"] + errors["post"]), default=float("nan"))


def worst_table(finals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (rule, row type): sampled, attacked and certified suprema over positions,
    as mean, smallest and largest over seeds."""
    rows = []
    for rule in RULES:
        sel = [f for f in finals if f["rule"] == rule]
        for kind in ("pre", "post", "trigger", "bos"):
            sampled = [max(finite(f["sampled"][kind]), default=float("nan")) for f in sel]
            attacked = [max(finite(f["attacked"][kind]), default=float("nan")) for f in sel]
            cert = []
            for f in sel:
                c = f.get("certified")
                if c is None or kind == "trigger":
                    continue
                cert.append(c["bos"] if kind == "bos" else
                            max(r["upper"] for r in c["rows"] if r["kind"] == kind))
            rows.append({"rule": rule, "kind": kind, "n": len(sel),
                         "sampled": spread(sampled), "attacked": spread(attacked),
                         "certified": spread(cert) if cert else None})
    return rows


def spread(values: list[Any]) -> dict[str, float | None]:
    """Mean, smallest and largest of the finite values (each None when there are none)."""
    vals = finite(values)
    if not vals:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals))}


def ratio_certified_attacked(final: dict[str, Any]) -> float:
    """Certified upper bound over attacked lower bound of the non-trigger supremum."""
    cert = final["certified"]["upper"]
    att = nontrigger(final["attacked"])
    return cert / att if att > 0 else (1.0 if cert <= 0 else math.inf)


def worst_claims(records: dict[str, Any]) -> list[Claim]:
    w = records["worst"]
    finals = w["finals"]
    out = []
    gaps = [nontrigger(f["attacked"]) - f["certified"]["upper"] for f in finals
            if f.get("certified")]
    out.append(cl.exact(
        "worst.certified_above_attack",
        "On every trained 1x1 model, the certified upper bound of the non-trigger supremum is "
        "never below the attack's lower bound", max(gaps), 0.0,
        f"largest attacked minus certified over {len(gaps)} models"))
    soft = [f for f in finals if f["rule"] == "softmax"]
    if soft:
        ratios = [ratio_certified_attacked(f) for f in soft]
        out.append(cl.exact(
            "worst.softmax.certified_within_factor",
            f"On every trained 1x1 softmax model the certified upper bound of the non-trigger "
            f"supremum is within a factor {FACTOR:g} of the attack's lower bound",
            max(ratios), FACTOR, f"largest certified / attacked over {len(ratios)} models"))
        under = [nontrigger(f["attacked"]) / max(finite(f["sampled"]["bos"]
                                                         + f["sampled"]["pre"]
                                                         + f["sampled"]["post"]))
                 for f in soft]
        out.append(cl.mean_at_least(
            "worst.softmax.sample_understates",
            f"Random test sequences understate a trained softmax model's non-trigger worst case "
            f"at least {UNDERSTATES:g}-fold: the attacked error over the sampled one ({SAMPLED:,}"
            " sequences), mean over seeds", under, UNDERSTATES))
    relu = [f for f in finals if f["rule"] == "relu"]
    if relu:
        out.append(cl.every(
            "worst.relu.zero_rows_certified",
            "Every trained 1x1 ReLU model's non-trigger rows are certified zero for every input "
            "(no non-trigger query gives any key a positive score)",
            sum(f["relu_score"]["certified_zero"] for f in relu), len(relu),
            "certified zero"))
    con = w["construction"]
    out.append(cl.exact(
        "worst.relu.construction_certified",
        "The hand-built ReLU construction's non-trigger rows are certified zero for every input",
        con["relu_score"]["max"], 0.0, "largest score of a non-trigger query over every input"))
    return out


def necessity_claims(records: dict[str, Any]) -> list[Claim]:
    w = records["worst"]
    checks = [c["check"] for c in w["checkpoints"] if c["rule"] == "softmax"]
    out = []
    if checks:
        out.append(cl.exact(
            "necessity.every_checkpoint_allowed",
            "Every saved checkpoint of every trained 1x1 softmax model lies on the allowed side "
            "of the necessity bound (both parts, every pre-trigger row)",
            max(c["violation"] for c in checks), 0.0,
            f"largest bound minus attacked error over {len(checks)} checkpoints"))
    fam = [f for f in w["family"] if f["check"]["min_slack"] is not None]
    if fam:
        out.append(cl.exact(
            "necessity.family_tight",
            f"Along the sink family the bound is tight: made {STRONGER:g} times stronger it is "
            "violated by some family member",
            min(f["check"]["min_slack"] for f in fam) / STRONGER, 1.0,
            f"smallest slack (error / bound) over {len(fam)} gaps, divided by {STRONGER:g}"))
    return out


def denied_worst_claims(records: dict[str, Any]) -> list[Claim]:
    tol = records["protocol"]["tol"]
    rows = records["worst"]["denied"]
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        sel = [r for r in rows if r["setting"] == setting]
        soft = [r for r in sel if r["rule"] == "softmax"]
        if not soft:
            continue
        out.append(cl.mean_at_least(
            f"denied.softmax.{setting}.beyond_row1",
            f"Softmax 1x1, {setting}: away from row 1 too, the worst-case non-trigger error "
            f"stays at or above the stop rule's {tol:g} (mean over seeds)",
            [r["others"] for r in soft], tol))
    return out


COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}


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
                        up[r["i"]] = max(r["upper"], floor)
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
                                         "(eps_T + nu >= delta)", "x"),
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
    delta = w["family"][0]["check"]["delta"] if w["family"] else 1.0
    grid = np.logspace(-8, 0, 50)
    left.plot(grid, delta * grid, "k--", label=f"bound, eps_T = nu = 0: {delta:.3f} (1 - b)")
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
        ax.scatter([f["norm"] for f in fin], [max(f["certified"]["upper"], floor) for f in fin],
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


# ----------------------------------------------------------------------- plain stacks


def _known(flags: list[bool | None]) -> list[bool]:
    return [f for f in flags if f is not None]


def all_covered(run: dict[str, Any]) -> bool:
    """Whether every non-trigger query position of the run has a sinking head somewhere."""
    return all(_known(run["positions_covered"]))


def coverage_text(flags: list[bool | None]) -> str:
    """'k/n': positions with a sinking head, of the positions where the row type occurs."""
    known = _known(flags)
    return f"{sum(known)}/{len(known)}"


def heads_text(pairs: list[list[int]]) -> str:
    """Sink heads as 'L1H2, L3H1' (or '-' for none)."""
    return ", ".join(f"L{layer}H{head}" for layer, head in pairs) or "-"


def _by_config(runs: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(experiment, rule, its runs) for every configuration that has runs, in order."""
    out = []
    for e in PLAIN_EXPERIMENTS:
        for rule in PLAIN_RULES:
            sel = [r for r in runs if r["experiment"] == e and r["rule"] == rule]
            if sel:
                out.append((e, rule, sel))
    return out


def plain_groups(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (experiment, rule), over seeds: how the runs stopped (not a claim: a count), their
    steps and errors, and how many have a sink head (with its 95% Clopper-Pearson interval)."""
    out = []
    for e, rule, sel in _by_config(runs):
        steps = [r["steps"] for r in sel]
        with_sink = sum(bool(r["sink_heads"]) for r in sel)
        out.append({
            "experiment": e, "rule": rule, "n": len(sel),
            **{stop: sum(r["status"] == stop for r in sel) for stop in STOPS},
            "steps_min": min(steps), "steps_max": max(steps),
            "best_train_linf": finite([r["best_train_linf"] for r in sel]),
            "test_linf": finite([r["test_linf"] for r in sel]),
            "with_sink": with_sink,
            "with_sink_interval": list(cl.clopper_pearson(with_sink, len(sel))),
            "all_covered": sum(all_covered(r) for r in sel),
        })
    return out


def plain_claims(records: list[dict[str, Any]]) -> list[Claim]:
    """The theorem's multi-layer claim, tested where its premise holds: over the seeds of each
    (experiment, rule) that reached the stop rule. Softmax: every such seed has a sink head,
    and a sinking head at every non-trigger position; ReLU: no such seed has a sink head. With
    no seed at the stop rule the claim is undetermined and says so; how often the seeds that
    did not get there sink is a table (``plain_groups``), not a claim."""
    thr = SINK_HEAD_THRESHOLD
    sink = f"a head at non-trigger BOS mass >= {thr:g}"
    out = []
    for e, rule, sel in _by_config(records):
        conv = [r for r in sel if r["converged"]]
        what = f"plain-target {e} {rule}"
        whose = f"(those of {len(sel)} that reached the stop rule) "
        tests = ([("no_sink_head", cl.none,
                   f"No {what} seed that reached the stop rule has a sink head: ReLU "
                   "needs none without a residual stream either",
                   sum(bool(r["sink_heads"]) for r in conv), f"have {sink}")]
                 if rule == "relu" else
                 [("some_head_sinks", cl.every,
                   f"Every {what} seed that reached the stop rule has some head that "
                   "sinks (the theorem's existential claim)",
                   sum(bool(r["sink_heads"]) for r in conv), f"have {sink}"),
                  ("every_position_covered", cl.every,
                   f"In every {what} seed that reached the stop rule, every non-trigger "
                   f"query position has a head somewhere in the stack with BOS mass >= "
                   f"{thr:g} there", sum(all_covered(r) for r in conv),
                   "have such a head at every non-trigger position")])
        for name, build, sentence, k, have in tests:
            claim = build(f"plain.{e}.{rule}.{name}", sentence, k, len(conv),
                          whose + have)
            if not conv:  # the premise holds for no seed: nothing to test
                claim = dataclasses.replace(
                    claim, data=f"none of the {len(sel)} seed(s) reached the stop rule "
                                "within the step cap, so no model solves the task",
                    needed_text=f"seeds that reach the stop rule (a longer step cap than "
                                f"{max(r['steps'] for r in sel):,}, or another protocol): "
                                f"{cl.UNIVERSAL_SEEDS} of them, all alike, can decide it")
            out.append(claim)
    return out


def _runs(records: dict[str, Any]) -> list[dict[str, Any]]:
    return records["plain"]["runs"]


def _experiments(records: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["experiment"] for r in _runs(records)))


def plain_grid(records: dict[str, Any], opts: Any) -> tuple[int, int]:
    """Rows: the experiments run; columns: the rules."""
    return (max(len(_experiments(records)), 1), len(PLAIN_RULES))


def draw_plain(axes: Any, records: dict[str, Any], opts: Any) -> None:
    """Per experiment (row) and rule (column), a line per seed: the largest non-trigger BOS
    mass over every head and layer at each query position, with the sink threshold dashed."""
    grid = np.asarray(axes, dtype=object).reshape(-1, len(PLAIN_RULES))
    for row, e in zip(grid, _experiments(records)):
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


