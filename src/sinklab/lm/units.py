"""The heads' two units in ``sinklab lm``'s interventions: a causal model's head sweep and global
edits, as kept in the records, summarised for the report and the claims.

- ``Units``: the head sweep laid out by head, (heads, probes) per ablation and head statistic,
  the sink heads and the pool of other heads their random control sets are drawn from;
- ``head_analysis``: each statistic's sink-set mean against random sets of other heads, with
  the two-level (heads x probes) bootstrap of ``sinklab.lm.head_sets``;
- ``moved_analysis``: where the first key's weight goes when it is hidden at every layer;
- ``described``: one model's interventions with all of the above, each edit's interval over
  probes (``probe_summary``, ``with_bands``) and the rank correlations over every head.

Every bootstrap is drawn with a fixed seed per statistic (``SEEDS_OF``), so that the report's
numbers and the claims (``sinklab.studies.lm_analysis``), recomputed from the records, agree.
Numpy and scipy, no torch::

    iv = described(records_of_one_model["interventions"])
    iv["units"]["zero"]["sink"]["estimate"]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as st

from sinklab.lm import head_sets, settings
from sinklab.lm.settings import needs_text
from sinklab.stats import ALPHA, finite, nan_mean

HOWS = ("zero", "mean", "cap")  # the head ablations: zeroed, mean-ablated, first-token mass capped
DRAWS = settings.BOOTSTRAP_DRAWS


def as_array(values: Any) -> np.ndarray:
    """A list from the records (None where JSON wrote a nan) as a float array."""
    return np.asarray([[math.nan if v is None else v for v in row] for row in values]
                      if values and isinstance(values[0], list)
                      else [math.nan if v is None else v for v in values], dtype=float)


def probe_summary(values: list[float | None]) -> dict[str, Any]:
    """The mean of per-probe values with its bootstrap interval over probes (one-sided 95%
    bounds, from the same draws as the claims')."""
    arr = np.asarray(finite(values), dtype=float)
    if arr.size < 2:
        mean = float(arr.mean()) if arr.size else math.nan
        return {"mean": mean, "interval": [math.nan, math.nan], "n": int(arr.size)}
    draws = head_sets.two_level(arr[None, :], DRAWS, seed=settings.CONTROL_SEED)
    lo, hi = np.quantile(draws, [ALPHA, 1 - ALPHA])
    return {"mean": float(arr.mean()), "interval": [float(lo), float(hi)], "n": int(arr.size)}


def probe_draws(values: list[float | None], seed: int) -> tuple[float, np.ndarray, int]:
    """A per-probe mean, its bootstrap over probes, and the probes it rests on."""
    arr = np.asarray(finite(values), dtype=float)
    if arr.size < 2:
        return (float(arr.mean()) if arr.size else math.nan), np.zeros(0), int(arr.size)
    return float(arr.mean()), head_sets.two_level(arr[None, :], DRAWS, seed=seed), int(arr.size)


class Units:
    """One causal model's head sweep laid out by head: per (head, probe) the loss change of
    each ablation and the head statistics, the sink heads and the others (the pool the random
    control sets are drawn from), and every head-set statistic with its two-level bootstrap
    (``sinklab.lm.head_sets``), drawn with fixed seeds so that the report and the claims,
    recomputed from the records, agree."""

    def __init__(self, iv_rec: dict[str, Any]) -> None:
        rows = sorted(iv_rec["heads"], key=lambda r: (r["layer"], r["head"]))
        self.order = [(r["layer"], r["head"]) for r in rows]
        self.effects = {how: as_array([r[how] for r in rows]) for how in HOWS}  # (heads, P)
        stats = {k: np.asarray(as_array_3d(v), dtype=float)
                 for k, v in iv_rec["head_stats"].items()}  # (P, layers, heads)
        self.stats = {k: np.stack([v[:, layer, head] for layer, head in self.order])
                      for k, v in stats.items()}  # (heads, P)
        index = {pair: i for i, pair in enumerate(self.order)}
        self.sink = np.asarray([index[tuple(h)] for h in iv_rec["sink_heads"]], dtype=int)
        self.pool = np.setdiff1d(np.arange(len(self.order)), self.sink)
        self.size = len(self.sink)
        self.n_probes = self.effects["zero"].shape[1]
        self.sets = head_sets.control_sets(len(self.pool), self.size, settings.CONTROL_SETS,
                                           seed=settings.CONTROL_SEED) if len(self.pool) \
            else np.zeros((0, self.size), dtype=int)

    def values(self, name: str) -> np.ndarray:
        """(heads, probes) of an ablation (zero, mean, cap) or a head statistic."""
        return self.effects[name] if name in self.effects else self.stats[name]

    def sink_draws(self, name: str, seed: int) -> tuple[float, np.ndarray]:
        """The sink set's mean of ``name`` and its two-level bootstrap."""
        sink = self.values(name)[self.sink]
        return head_sets.set_mean(sink), head_sets.two_level(sink, DRAWS, seed=seed)

    def control_draws(self, name: str, seed: int) -> tuple[float, np.ndarray]:
        """The same statistic for a random set of as many other heads: the mean over every
        other head and the distribution of a random set's mean (probes resampled too)."""
        pool = self.values(name)[self.pool]
        return head_sets.set_mean(pool), head_sets.random_set(pool, self.size, DRAWS, seed=seed)

    def set_means(self, name: str) -> np.ndarray:
        """Each of the ``CONTROL_SETS`` random sets' mean of ``name`` over every probe."""
        return head_sets.set_means(self.values(name)[self.pool], self.sets)

    def output_ratio(self, seed: int) -> tuple[tuple[float, np.ndarray], tuple[float,
                                                                              np.ndarray]]:
        """The sink heads' mean output norm over that of the other heads, with its bootstrap
        (the sink heads resampled, a fresh random set of others in each draw, the probes
        resampled for both); and the same ratio for a random set in the sink set's place."""
        out = self.values("output_norm")
        sink = head_sets.compared(out[self.sink], out[self.pool], DRAWS, seed=seed, ratio=True)
        pool = out[self.pool]
        mean = head_sets.set_mean(pool)
        control = head_sets.random_set(pool, self.size, DRAWS, seed=seed + 1) / mean
        return sink, (1.0, control)


def as_array_3d(values: Any) -> np.ndarray:
    """A (probes, layers, heads) list from the records, None as nan."""
    return np.asarray([[[math.nan if v is None else v for v in row] for row in layer]
                       for layer in values], dtype=float)


# the direction each claim about the sink heads takes against random sets of other heads
# (``sinklab.studies.lm_analysis``), so the tail its head-level permutation p-value is read from:
# ablating a sink head changes the loss less (a sink head does nothing), capping its first-token
# mass raises the loss more (the sink is needed), its first value is shorter (value-state
# drain) and its output smaller (it does little)
TAIL_OF = {"zero": "below", "mean": "below", "cap": "above", "value_ratio": "below",
           "output_norm": "below"}

SEEDS_OF = {"zero": 11, "mean": 12, "cap": 13, "value_ratio": 14, "output_norm": 15,
            "moved": 16}  # a fixed seed per statistic: the report's numbers and the claims agree


def _distribution(estimate: float, draws: np.ndarray) -> dict[str, Any]:
    return {"estimate": estimate, **head_sets.summary(draws)}


def head_analysis(iv_rec: dict[str, Any]) -> dict[str, Any]:
    """What the report shows of the head sweep: for each ablation and head statistic, the sink
    set's mean with its two-level bootstrap, the same for a random set of other heads, the
    random control sets' means and the share of them at or beyond the sink set's in the
    direction the sink heads' claim takes (``TAIL_OF``: a one-sided head-level permutation
    p-value, (1 + count) / (1 + sets)); per sink head its numbers and where it falls among the
    other heads; and every head's mean effects for the figures."""
    units = Units(iv_rec)
    out: dict[str, Any] = {"n_heads": len(units.order), "n_sink": units.size,
                           "n_pool": len(units.pool), "n_sets": len(units.sets),
                           "n_probes": units.n_probes, "draws": DRAWS}
    for name in (*HOWS, "value_ratio", "output_norm"):
        seed = SEEDS_OF[name]
        est, draws = units.sink_draws(name, seed)
        c_est, c_draws = units.control_draws(name, seed + 100)
        sets = units.set_means(name)
        diff, diff_draws = head_sets.compared(units.values(name)[units.sink],
                                              units.values(name)[units.pool], DRAWS,
                                              seed=seed + 200)
        out[name] = {"sink": _distribution(est, draws),
                     "random": _distribution(c_est, c_draws),
                     "sets": head_sets.summary(sets),
                     "tail": TAIL_OF[name],
                     "p_value": head_sets.share_beyond(est, sets, TAIL_OF[name]),
                     "difference": _distribution(diff, diff_draws)}
    (ratio, ratio_draws), (c_ratio, c_draws) = units.output_ratio(SEEDS_OF["output_norm"] + 300)
    out["output_ratio"] = {"sink": _distribution(ratio, ratio_draws),
                           "random": _distribution(c_ratio, c_draws)}
    pool_means = {name: nan_mean(units.values(name)[units.pool], 1)
                  for name in (*HOWS, "output_norm")}
    per_head = []
    for i in units.sink:
        layer, head = units.order[i]
        entry = {"layer": layer, "head": head,
                 "first": float(nan_mean(units.stats["first"][i], 0)),
                 "value_ratio": float(nan_mean(units.stats["value_ratio"][i], 0)),
                 "output": float(nan_mean(units.stats["output_norm"][i], 0)
                                 / nan_mean(pool_means["output_norm"], 0))}
        for how in HOWS:
            entry[how] = probe_summary(units.effects[how][i].tolist())
            # the share of the other heads whose ablation changes the loss by more
            entry[f"{how}_rank"] = float(np.mean(np.abs(pool_means[how])
                                                 > abs(entry[how]["mean"])))
        per_head.append(entry)
    out["sink_heads"] = per_head
    out["every_head"] = {"layer": [p[0] for p in units.order], "head": [p[1] for p in units.order],
                         "first": nan_mean(units.stats["first"], 1).tolist(),
                         "sink": [bool(i in set(units.sink.tolist()))
                                  for i in range(len(units.order))],
                         **{how: nan_mean(units.effects[how], 1).tolist() for how in HOWS}}
    return out


def moved_analysis(iv_rec: dict[str, Any]) -> dict[str, Any]:
    """Where the first key's weight goes when it is hidden at every layer: per head, the share
    of the weight it had that each key group gains (the hidden model's weight on the group
    minus the unedited model's, over the first key's weight, at the queries from
    ``MOVED_FROM`` on; the shares sum to 1), and the share each group would gain if the weight
    were handed out in proportion to the weights the other keys had. Summaries: the sink
    heads' mean share (with a two-level bootstrap of the share to the first group) and every
    head's, weighted by the first key's weight."""
    plain = np.asarray(iv_rec["moved"]["plain"], dtype=float)  # (P, L, H, 1 + groups)
    hidden = np.asarray(iv_rec["moved"]["hidden"], dtype=float)  # (P, L, H, groups)
    proportional = np.asarray(iv_rec["moved"]["proportional"], dtype=float)
    first, before = plain[..., 0], plain[..., 1:]
    gained = hidden - before  # (P, L, H, groups)
    total = first.sum(0)  # (L, H)
    sinks = [tuple(h) for h in iv_rec["sink_heads"]]
    # a probe too short to have a query from MOVED_FROM on gives 0 / 0: not measured (nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = gained.sum(0) / total[..., None]  # (L, H, groups)
        expected = proportional.sum(0) / total[..., None]
        per_probe = gained / first[..., None]  # (P, L, H, groups)
        weighted = gained.sum((0, 1, 2)) / total.sum()
        weighted_expected = proportional.sum((0, 1, 2)) / total.sum()
        by_layer = gained.sum((0, 2)) / total.sum(1)[:, None]  # (L, groups)
        by_layer_expected = proportional.sum((0, 2)) / total.sum(1)[:, None]
    sink_share = np.stack([share[layer, head] for layer, head in sinks])  # (sinks, groups)
    sink_expected = np.stack([expected[layer, head] for layer, head in sinks])
    sink_probe = np.stack([per_probe[:, layer, head, 0] for layer, head in sinks])  # (sinks, P)
    measured = bool(np.isfinite(sink_probe).any())
    draws = head_sets.two_level(sink_probe, DRAWS, seed=SEEDS_OF["moved"]) if measured \
        else np.full(2, np.nan)
    return {"groups": iv_rec["destinations"], "from": iv_rec["moved_from"],
            "sink_share": nan_mean(sink_share, 0).tolist(),
            "sink_expected": nan_mean(sink_expected, 0).tolist(),
            "sink_first": _distribution(head_sets.set_mean(sink_probe), draws)
            if measured else None,
            "all_share": weighted.tolist(), "all_expected": weighted_expected.tolist(),
            "by_layer": by_layer.tolist(), "by_layer_expected": by_layer_expected.tolist(),
            "first_mean": float(first.sum() / max(np.isfinite(first).sum(), 1))}


def with_bands(edit: dict[str, Any]) -> dict[str, Any]:
    """A global edit's (or StreamingLLM cache's) record with the mean and interval over probes
    (``probe_summary``) of it, of each of its position bands and of its control."""
    out = {**edit, "summary": probe_summary(edit["per_probe"])}
    if "bands" in edit:
        out["bands"] = [{**b, "summary": probe_summary(b["per_probe"])} for b in edit["bands"]]
    if "control" in edit:
        out["control"] = with_bands(edit["control"])
    return out


def described(done: dict[str, Any]) -> dict[str, Any]:
    """One model's interventions with what the report shows computed from them: each edit's
    and its control's mean and interval over probes, by position band too; the head sweep's
    head-set statistics against random control sets; where a hidden first key's weight goes;
    and the rank correlations over every head."""
    if done.get("refused") or done.get("not_measured"):
        return done
    out = {**done, "global": [with_bands(g) for g in done["global"]]}
    if "baseline" not in done:  # an encoder: hidden-state changes only
        return out
    out["baseline_mean"] = float(nan_mean(np.asarray(finite(done["baseline"]), dtype=float),
                                          0))
    out["streaming_missing"] = needs_text(done["streaming_needs"], done.get("prefix", []))
    out["streaming"] = [with_bands(s) for s in done["streaming"]]
    out["units"] = head_analysis(done)
    out["where_moved"] = moved_analysis(done)
    # the per-probe weights behind it are kept in the cache (cache/MODEL-interventions.json),
    # not in the records: every number the report and the claims use is in where_moved
    del out["moved"]
    out["targeted_count"] = sum(1 for t in done["targeted"]
                                if t["summary"]["n_probes"] >= 2
                                and t["summary"]["interval"][0] is not None
                                and math.isfinite(t["summary"]["interval"][0])
                                and t["summary"]["interval"][0] > 0)
    stats = {k: nan_mean(as_array_3d(v), 0).ravel() for k, v in done["head_stats"].items()}
    for key, other in (("spearman", "output_norm"), ("spearman_value", "value_ratio")):
        x, y = stats["first"], stats[other]
        ok = np.isfinite(x) & np.isfinite(y)
        rho, p = (st.spearmanr(x[ok], y[ok]) if ok.sum() > 2 and np.ptp(x[ok]) > 0
                  and np.ptp(y[ok]) > 0 else (math.nan, math.nan))
        out[key] = {"rho": float(rho), "p": float(p), "n_heads": int(ok.sum())}
    return out
