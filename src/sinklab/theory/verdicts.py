"""What the theory study concludes from its records, and the numbers of its protocol, without
torch: the claims and figures of its worst-case, necessity, denied-sink and plain-stack sections
(their measurements are ``bounds`` and ``stacks``), and the settings its options, help texts and
those measurements name. ``sinklab.studies.theorem`` declares the study with them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
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
PLATEAU_PATIENCE = 2000
ERROR_BINS = ((1.0, math.inf), (0.1, 1.0), (0.01, 0.1), (0.0, 0.01))
RULES = ("softmax", "relu")
NAMES = {"softmax": "softmax", "relu": "ReLU"}  # the rules as the reports write them
SAMPLED = 2000  # test sequences of the sampled errors (every trigger position)
UNDERSTATES = 2.0  # "the sample understates the worst case": attacked / sampled at least this
FACTOR = 2.0  # the certified upper bound within this factor of the attack's lower bound
STRONGER = 1.1  # the bound made this much stronger must be violated somewhere
CHECKPOINT_RESTARTS = 2  # random starts per row of the cheap attack at every checkpoint
ROUNDING = 1e-12  # relative: a bound and an error computed along two float64 paths may differ
PLAIN_EXPERIMENTS = ("2x2", "4x4")
PLAIN_RULES = ("softmax", "relu")
PLAIN_LOG_EVERY = 100
# The plain stacks' protocol search: a grid of initial weight scales (model.init_std) and
# learning rates, every point trained on the search's seeds 0..PLAIN_GRID_SEEDS-1 with the
# plateau rule and a step cap of at most PLAIN_GRID_STEPS, at a constant rate. ``plain_choice``
# picks a point per shape and rule; PLAIN_PROTOCOL holds the points it picked on seeds 0-2, and
# the stacks the claims read are trained there on fresh seeds, PLAIN_FIRST_SEED on, with
# PLAIN_LR_DROPS tenfold drops of the rate where the plateau rule fires (``train.lr_drops``):
# on seeds 3-5 of 4x4 softmax at a constant 1e-3 every run ended on a plateau or at the cap with
# batch L∞ 1.7e-2 to 1.1e-1, the rate's own noise, which the drops remove.
PLAIN_GRID_STD = (0.02, 0.1, 0.2, 0.3)
PLAIN_GRID_LR = (3e-4, 1e-3, 3e-3)
# quick: no search (the stacks train at PLAIN_PROTOCOL), the study's slowest part otherwise
PLAIN_GRID_SEEDS, QUICK_PLAIN_GRID_SEEDS = 3, 0
PLAIN_GRID_STEPS = 8000
PLAIN_LR_DROPS = 2
PLAIN_FIRST_SEED = PLAIN_GRID_SEEDS
PLAIN_PROTOCOL = {  # (shape, rule): (init_std, lr), plain_choice's pick on seeds 0-2
    ("2x2", "softmax"): (0.1, 1e-3), ("2x2", "relu"): (0.1, 1e-3),
    ("4x4", "softmax"): (0.2, 1e-3), ("4x4", "relu"): (0.02, 3e-4),
}
PLAIN_ATTACK_RESTARTS = 4  # random starts per (trigger, row) of the attack on plain stacks


def grid_runs(seeds: int) -> list[tuple[str, str, float, float, int]]:
    """Every run of the protocol search, as (shape, rule, init_std, lr, seed), seeds 0..seeds-1,
    in the grid's order."""
    return list(itertools.product(PLAIN_EXPERIMENTS, PLAIN_RULES, PLAIN_GRID_STD, PLAIN_GRID_LR,
                                  range(seeds)))


PLAIN_SEQUENCES, QUICK_PLAIN_SEQUENCES = 1000, 200  # test sequences of the BOS measurements
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
    as mean, smallest and largest over seeds (certified trigger rows where the records have
    them)."""
    rows = []
    for rule in RULES:
        sel = [f for f in finals if f["rule"] == rule]
        for kind in ("pre", "post", "trigger", "bos"):
            sampled = [max(finite(f["sampled"][kind]), default=float("nan")) for f in sel]
            attacked = [max(finite(f["attacked"][kind]), default=float("nan")) for f in sel]
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
                         "sampled": spread(sampled), "attacked": spread(attacked),
                         "certified": certified_spread(cert) if cert else None})
    return rows


def certified_spread(values: list[float]) -> dict[str, float | None]:
    """``spread`` of certified upper bounds, where an unknown (infinite) bound of any seed
    makes the mean and the largest unknown too, instead of leaving that seed out."""
    out = spread(values)
    if any(v == math.inf for v in values):
        out.update(mean=math.inf, max=math.inf)
    return out


def spread(values: list[Any]) -> dict[str, float | None]:
    """Mean, smallest and largest of the finite values (each None when there are none)."""
    vals = finite(values)
    if not vals:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals))}


def upper(value: float | None) -> float:
    """A certified upper bound read back from a record: JSON writes an unknown (infinite) bound
    as null, which bounds nothing."""
    return math.inf if value is None else value


def ratio_certified_attacked(final: dict[str, Any]) -> float:
    """Certified upper bound over attacked lower bound of the non-trigger supremum."""
    cert = upper(final["certified"]["upper"])
    att = nontrigger(final["attacked"])
    return cert / att if att > 0 else (1.0 if cert <= 0 else math.inf)


def no_premise(claim: Claim, why: str, cap: int | None) -> Claim:
    """A rate claim over the seeds that reached the stop rule, when none did: there is nothing
    to test, and the claim says so, with what would decide it (instead of a count of zero seeds
    and a sample size worked out from it). ``cap`` is the largest step count of those runs."""
    cap_words = (f"these runs all stopped by step {cap:,}: a longer budget" if cap else
                 "a longer budget")
    reason = (f"{why}, so the claim has nothing to test; it needs seeds that reach the stop rule "
              f"({cap_words}, or another protocol): at least {cl.MIN_N} for any decision, and "
              f"{cl.seeds_all_agreeing(1)} all agreeing before even an uncorrected test could "
              f"support it")
    return dataclasses.replace(claim, reason=reason, basis=None, needed=None,
                               needed_against=None, data=why, needed_text=f"{reason}.")


def worst_claims(records: dict[str, Any]) -> list[Claim]:
    """The worst-case section: the certifier's soundness and tightness and the ReLU
    construction's certificate (checks), how much random sequences understate the worst case
    (descriptive: no setting must come out the other way), and trained ReLU models' zero rows
    (empirical; control: the same runs at step 0, untrained)."""
    w = records["worst"]
    finals = w["finals"]
    out = []
    gaps = [nontrigger(f["attacked"]) - upper(f["certified"]["upper"]) for f in finals
            if f.get("certified")]
    out.append(cl.check(
        "worst.certified_above_attack",
        "The certificate is sound on the trained 1x1 models: on each, the certified upper bound "
        "of the non-trigger supremum is at or above the attack's lower bound (a check of "
        "sinklab's certifier and attack against each other)",
        max(gaps, default=math.nan), 0.0,
        f"largest attacked minus certified over {len(gaps)} models"))
    soft = [f for f in finals if f["rule"] == "softmax"]
    if soft:
        ratios = [ratio_certified_attacked(f) for f in soft]
        out.append(cl.check(
            "worst.softmax.certified_within_factor",
            f"The certificate is tight on the trained 1x1 softmax models: on each, the certified "
            f"upper bound of the non-trigger supremum is within a factor {FACTOR:g} of the "
            "attack's lower bound (a property of sinklab's certifier, not of the models)",
            max(ratios), FACTOR, f"largest certified / attacked over {len(ratios)} models"))
        under = [nontrigger(f["attacked"]) / max(finite(f["sampled"]["bos"]
                                                         + f["sampled"]["pre"]
                                                         + f["sampled"]["post"]))
                 for f in soft]
        base = cl.median_at_least(
            "worst.softmax.sample_understates", "", under, UNDERSTATES,
            what=f"attacked over sampled non-trigger error per model ({SAMPLED:,} sampled "
                 f"sequences); {sum(u >= UNDERSTATES for u in under)} of {len(under)} at least "
                 f"{UNDERSTATES:g}-fold")
        sentence = (f"How far random test sequences ({SAMPLED:,} of them) understate a trained "
                    f"1x1 softmax model's non-trigger worst case: the attacked error over the "
                    f"sampled one, per seed, beside {UNDERSTATES:g}-fold. Descriptive: no setting "
                    "must come out the other way, so there is no control and no verdict")
        out.append(cl.descriptive(
            base.key, sentence, base.data, base.n, base.estimate, base.interval,
            test="none (descriptive): the median over seeds with its one-sided "
                 f"{cl.CONFIDENCE} order-statistic bounds"))
    relu = [f for f in finals if f["rule"] == "relu"]
    if relu:
        untrained = [c for c in w["checkpoints"] if c["rule"] == "relu" and c["step"] == 0]
        sentence = (f"Trained 1x1 ReLU models have every non-trigger row certified zero for every "
                    f"input (no non-trigger query gives any key a positive score) at a rate above "
                    f"{cl.R0:g}")
        claim = cl.rate_at_least(
            "worst.relu.zero_rows_certified", sentence,
            sum(f["relu_score"]["certified_zero"] for f in relu), len(relu),
            "have every non-trigger row certified zero (final models)")
        control = cl.rate_at_least(
            "worst.relu.zero_rows_certified.control", sentence,
            sum(c["certified_zero"] for c in untrained), len(untrained),
            "have every non-trigger row certified zero (step-0 checkpoints: the paper's "
            "initialisation, before any update)")
        out.append(cl.with_control(claim, control, "the same ReLU runs at step 0, untrained"))
    con = w["construction"]
    out.append(cl.check(
        "worst.relu.construction_certified",
        "The hand-built ReLU construction's non-trigger rows are certified zero for every input",
        con["relu_score"]["max"], 0.0, "largest score of a non-trigger query over every input"))
    return out


def necessity_claims(records: dict[str, Any]) -> list[Claim]:
    """The necessity bound at the checkpoints and along the family: checks of the proof and its
    code (the bound holds for any weights), not evidence about training."""
    w = records["worst"]
    checks = [c["check"] for c in w["checkpoints"] if c["rule"] == "softmax"]
    out = []
    if checks:
        out.append(cl.check(
            "necessity.every_checkpoint_allowed",
            "Each saved checkpoint of the trained 1x1 softmax models lies on the allowed side of "
            "the necessity bound (both parts, every pre-trigger row). A check of the proof and "
            "its code, not evidence about training: the bound holds for any weights, trained or "
            "not, since the error it plugs in includes the error at X* itself",
            max(c["violation"] for c in checks), 0.0,
            f"largest bound minus attacked error over {len(checks)} checkpoints"))
    fam = [f for f in w["family"] if f["check"]["min_slack"] is not None]
    if fam:
        out.append(cl.check(
            "necessity.family_tight",
            f"Along the sink family the bound is tight: made {STRONGER:g} times stronger it is "
            "violated by some family member (a check of the bound against exact errors)",
            min(f["check"]["min_slack"] for f in fam) / STRONGER, 1.0,
            f"smallest slack (error / bound) over {len(fam)} gaps, divided by {STRONGER:g}"))
    return out


DENIED_CONTROL = "the denied ReLU 1x1 runs (same settings, seeds, protocol and attack)"


def denied_parts(rows: list[dict[str, Any]], rule: str, value: Callable[[dict[str, Any]], float]
                 ) -> list[tuple[str, list[float]]]:
    """Per denied-sink setting (in order), the value of each of ``rule``'s rows."""
    return [(setting, [value(r) for r in rows if r["rule"] == rule and r["setting"] == setting])
            for setting in dict.fromkeys(r["setting"] for r in rows)]


def denied_worst_claims(records: dict[str, Any]) -> list[Claim]:
    """Away from row 1, whose error the cap forces by arithmetic, the denied softmax models'
    worst-case non-trigger error stays above the stop rule; pooled over the settings, with the
    denied ReLU models (whose non-trigger rows can be zero) through the same test."""
    tol = records["protocol"]["tol"]
    rows = records["worst"]["denied"]
    if not any(r["rule"] == "softmax" for r in rows):
        return []
    parts = {rule: denied_parts(rows, rule, lambda r: r["others"]) for rule in RULES}
    n_settings = len(parts["softmax"])
    sentence = (f"Softmax 1x1 models with their sink denied: away from row 1 too (the other "
                f"non-trigger rows, which the arithmetic of row 1 does not reach), the worst-case "
                f"error over every input (attacked, a lower bound) stays above the stop rule's "
                f"{tol:g}: the median over seeds, pooled over the {n_settings} denied-sink "
                f"settings")
    what = "attacked worst-case error at the non-trigger rows other than row 1, per seed"
    claim, control = (cl.median_at_least(key, sentence, None, tol, what=what, parts=parts[rule])
                      for key, rule in (("denied.softmax.beyond_row1", "softmax"),
                                        ("denied.softmax.beyond_row1.control", "relu")))
    return [cl.with_control(claim, control, DENIED_CONTROL)]


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


def grid_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The protocol search per (shape, rule, init_std, lr), over its seeds: how many reached the
    stop rule, the median steps of those that did (None if none did), and the median best
    training-batch L∞. ``rows`` are one per grid run (``stacks.grid_records``)."""
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
            "best_linf_median": _median_or_inf([r["best_train_linf"] for r in sel]),
        })
    return out


def _median_or_inf(values: list[Any]) -> float | None:
    """The median of the finite values, None when there is none (every run diverged)."""
    kept = finite(values)
    return float(np.median(kept)) if kept else None


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
    """The theorem's multi-layer claim, tested where its premise holds: over the seeds that
    reached the stop rule, pooled over the stack shapes (one prediction; the per-shape counts
    and a heterogeneity test are in each claim). Softmax: such seeds have a sink head, and a
    sinking head at every non-trigger position, at a rate above r0; the control is the same
    seeds' stacks before any update (``untrained``), through the same test. ReLU: such seeds
    have a sink head at a rate below 1 - r0 (control: the softmax seeds at the stop rule). With
    no seed at the stop rule a claim (or its control) has nothing to test, and says so; how
    often the seeds that did not get there sink is a table (``plain_groups``), not a claim."""
    thr = SINK_HEAD_THRESHOLD
    configs = _by_config(records)
    if not configs:
        return []
    shapes = ", ".join(dict.fromkeys(e for e, _, _ in configs))
    cap = max(r["steps"] for _, _, sel in configs for r in sel)

    def has_sink(r: dict[str, Any]) -> bool:
        return bool(r["sink_heads"])

    def parts(rule: str, test: Callable[[dict[str, Any]], bool], untrained: bool
              ) -> list[tuple[str, int, int]]:
        found = []
        for e, r, sel in configs:
            if r == rule:
                conv = [x["untrained"] if untrained else x for x in sel if x["converged"]]
                found.append((e, sum(test(x) for x in conv), len(conv)))
        return found

    def build(key: str, sentence: str, rule: str, control: str, above: bool,
              test: Callable[[dict[str, Any]], bool], what: str) -> Claim:
        rate = cl.rate_at_least if above else cl.rate_at_most
        pair = []
        untrained = control == "untrained"
        for k, r, before in ((key, rule, False),
                             (f"{key}.control", rule if untrained else control, untrained)):
            c = rate(k, sentence, None, None,
                     f"{'before any update' if before else 'at the stop rule'} {what}",
                     parts=parts(r, test, before))
            if c.n == 0:
                runs = [(e, len(sel)) for e, rr, sel in configs if rr == r]
                why = (f"none of the {sum(n for _, n in runs)} plain-target {NAMES[r]} seeds "
                       f"({', '.join(f'{e}: {n}' for e, n in runs)}) reached the stop rule "
                       "within the step cap, so none of its models reached it" if runs else
                       f"no plain-target {NAMES[r]} stack was trained")
                c = no_premise(c, why, cap)
            pair.append(c)
        where = (f"the same seeds' softmax stacks ({shapes}) before any update, at their "
                 "initial weights" if untrained else
                 f"the plain-target {NAMES[control]} seeds ({shapes}) that reached the stop rule")
        return cl.with_control(pair[0], pair[1], where)

    setting = (f"Plain-target softmax stacks ({shapes}: no residual stream, the theorem's own "
               "multi-layer setting) that reached the stop rule")
    sink = f"have a head at non-trigger BOS mass >= {thr:g}"
    return [
        build("plain.softmax.some_head_sinks",
              f"{setting} have some head that sinks (the theorem's existential claim), at a rate "
              f"above {cl.R0:g}; pooled over the shapes", "softmax", "untrained", True,
              has_sink, sink),
        build("plain.softmax.every_position_covered",
              f"{setting} have, at every non-trigger query position, a head somewhere in the "
              f"stack with BOS mass >= {thr:g} there, at a rate above {cl.R0:g}; pooled over the "
              "shapes", "softmax", "untrained", True, all_covered,
              "have such a head at every non-trigger position"),
        build("plain.relu.no_sink_head",
              f"Plain-target ReLU stacks ({shapes}) that reached the stop rule have a sink head "
              f"at a rate below {1 - cl.R0:.2g}: ReLU needs none without a residual stream "
              "either; pooled over the shapes", "relu", "softmax", False, has_sink, sink),
    ]


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


