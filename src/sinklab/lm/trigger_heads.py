"""Trigger-conditional heads in real models, found against a permutation null.

A head is a *trigger-conditional candidate* when its first-key weight is high in general (it is
mostly dormant: it parks its attention on the first key) but drops for particular query tokens.
This module tests every mostly dormant head for such drops:

1. **Statistic.** For head h and token t (a token with at least ``min_count`` occurrences
   among the queries at positions >= ``min_position``), the sum of the head's first-key
   weights over t's occurrences, S_ht, against its mean and variance under the null below:
   z_ht = (E[S_ht] - S_ht) / sd(S_ht), large when the head puts *less* weight on the first
   key at t than the null expects. The head's statistic is T_h = max_t z_ht.
2. **Null.** Token labels are shuffled among the queries of the same stratum, by default the
   same *position* in other probes (``within="position"``): a head whose first-key weight
   depends on the position alone (queries late in a probe see more keys and often leave the
   first one) keeps that dependence under the null, so it is not mistaken for a
   token effect when some tokens sit mostly late. Each token keeps its count at every
   position, so E[S_ht] and sd(S_ht) are exact moments of sampling without replacement inside
   each stratum (position-matched expectations), fixed across permutations.
   ``within="probe"`` shuffles inside each probe instead (keeps probe effects, loses
   positions). The same permutation serves every head, so the heads' dependence is kept.
3. **Per-head p-value.** p_h = (1 + #{b : T_h^b >= T_h}) / (n_perm + 1) over ``n_perm``
   seeded permutations: the max over tokens makes it Westfall and Young's single-step max-T
   control over the head's tokens (a token's own adjusted p-value uses the same max null).
   The smallest attainable value is 1 / (n_perm + 1).
4. **Across heads.** Holm's step-down correction (family-wise error, the default) or
   Benjamini-Hochberg (false discovery rate, ``scipy.stats.false_discovery_control``) at
   ``alpha``. A kept head lists the tokens whose adjusted p-value is within the level its head
   passed (never a looser level than the head's), their counts, mean and expected first-key
   weights, and where the triggered queries attend (``lm.describe_targets``).

The null holds the head's weights fixed and moves only the labels, so dependence between the
queries of one probe is kept in the weights; what it does not model is a probe that repeats
one token and is unusual as a whole (``within="probe"`` guards against that one).

``targeted_effect`` measures an ablation's next-token loss change at a head's trigger positions
against its other positions, per probe, with a bootstrap interval over probes.

Example::

    scan = trigger_heads.scan(acc.query_arrays(), tokens, positions, probes, decode=tok.decode)
    scan.heads[0]["tokens"]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import sparse, stats

from sinklab.errors import LMError
from sinklab.lm import head_sets, settings
from sinklab.lm import loading as lm
from sinklab.stats import ALPHA, CONFIDENCE

N_PERM = 10_000  # permutations when n_perm is left unset (more when the correction needs them)
HEADROOM = 2  # ... at least enough that a lone head at the floor has adjusted p <= alpha / this
METHODS = ("holm", "bh")  # Holm (family-wise error) or Benjamini-Hochberg (false discovery rate)
STRATA = ("position", "probe")  # what the permutation keeps: shuffle labels within either
FEATURES = ("first", "prev", "self", "top", "offset", "entropy")  # lm.query_features' keys
BATCH = 64  # permutations whose shuffles are drawn at once (BATCH x queries floats) ...
GATHER_BYTES = 64 * 2**20  # ... and whose gathered residuals take at most this much memory
_TIE = 1e-5  # a permuted statistic this close (relative) counts as equal: sums are float32


class TriggerScanError(LMError):
    """Bad arguments to the trigger-head scan."""


@dataclass
class TriggerScan:
    """A permutation scan's outcome: the kept heads (best first) and what the test was.

    ``p_values`` / ``p_adjusted`` are (layers, heads) lists with None for heads not tested
    (not mostly dormant); ``min_p`` = 1 / (n_perm + 1) is the smallest attainable p-value and
    ``min_adjusted_p`` the adjusted value a lone head at that floor gets."""

    heads: list[dict[str, Any]]
    p_values: list[list[float | None]]
    p_adjusted: list[list[float | None]]
    n_layers: int
    n_heads: int
    n_tested: int
    n_queries: int
    n_probes: int
    n_tokens_tested: int
    n_perm: int
    min_p: float
    min_adjusted_p: float
    alpha: float
    method: str
    within: str
    seed: int
    min_count: int
    min_position: int
    dormant_level: float
    dormant_share: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- input checks


def _whole(value: Any) -> bool:
    """Whether ``value`` is an integer (Python's or numpy's), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check(arrays: dict[str, np.ndarray], tokens: np.ndarray, positions: np.ndarray,
           probes: np.ndarray, n_perm: int | None, alpha: float, method: str, within: str,
           min_count: int) -> None:
    """Raise TriggerScanError (one sentence) on any bad argument."""
    missing = [k for k in FEATURES if k not in arrays]
    if missing:
        raise TriggerScanError(f"the query arrays lack {', '.join(missing)}; the scan needs "
                               f"every lm.query_features key ({', '.join(FEATURES)}).")
    shape = np.shape(arrays["first"])
    if len(shape) != 3:
        raise TriggerScanError(f"the query arrays must be (layers, heads, queries), not shape "
                               f"{shape}.")
    for key in FEATURES:
        if np.shape(arrays[key]) != shape:
            raise TriggerScanError(f"query array {key!r} has shape {np.shape(arrays[key])}, "
                                   f"unlike 'first' {shape}.")
    for name, values in (("tokens", tokens), ("positions", positions), ("probes", probes)):
        if np.shape(values) != (shape[2],):
            raise TriggerScanError(f"{name} must be one value per query, shape ({shape[2]},), "
                                   f"not {np.shape(values)}.")
        if not np.issubdtype(np.asarray(values).dtype, np.integer):
            raise TriggerScanError(f"{name} must be integers, not {np.asarray(values).dtype}.")
    if n_perm is not None and not (_whole(n_perm) and n_perm >= 1):
        raise TriggerScanError(f"n_perm must be a whole number of at least 1 (got {n_perm!r}).")
    if not 0.0 < alpha < 1.0:
        raise TriggerScanError(f"alpha must lie strictly between 0 and 1 (got {alpha!r}).")
    if method not in METHODS:
        raise TriggerScanError(f"method {method!r} is unknown; choose one of "
                               f"{', '.join(METHODS)}.")
    if within not in STRATA:
        raise TriggerScanError(f"within {within!r} is unknown; choose one of "
                               f"{', '.join(STRATA)}.")
    if not (_whole(min_count) and min_count >= 1):
        raise TriggerScanError(f"min_count must be a whole number of at least 1 "
                               f"(got {min_count!r}).")


def perms_needed(n_tests: int, alpha: float) -> int:
    """Permutations for which a lone head at the floor 1 / (n_perm + 1) still passes the
    correction over ``n_tests`` heads with room to spare: n_tests / (n_perm + 1) <=
    alpha / HEADROOM (both Holm and Benjamini-Hochberg multiply a lone smallest p by n_tests)."""
    return max(1, math.ceil(HEADROOM * n_tests / alpha) - 1)


# ------------------------------------------------------------------------- corrections


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), p (m,) -> (m,)."""
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def adjust(p: np.ndarray, method: str) -> np.ndarray:
    """Adjusted p-values across heads by ``method`` (``METHODS``)."""
    if len(p) == 0:
        return p.astype(float)
    if method == "holm":
        return holm(p)

    return np.asarray(stats.false_discovery_control(p, method="bh"), dtype=float)


def levels(p: np.ndarray, adjusted: np.ndarray, alpha: float, method: str) -> np.ndarray:
    """The level each rejected head passed (nan for the others): Holm's alpha / (m - rank)
    at its rank (0-based) among the sorted p-values; Benjamini-Hochberg's alpha R / m with R
    the number of rejections. A rejected head's own p-value is within its level."""
    m = len(p)
    out = np.full(m, np.nan)
    rejected = adjusted <= alpha
    if not rejected.any():
        return out
    if method == "holm":
        rank = np.empty(m, dtype=int)
        rank[np.argsort(p, kind="stable")] = np.arange(m)
        out[rejected] = alpha / (m - rank[rejected])
    else:
        out[rejected] = alpha * rejected.sum() / m
    return out


# --------------------------------------------------------------------------------- scan


@dataclass
class _Layout:
    """The tested queries laid out once so that a permutation costs one sparse product.

    Queries are sorted by stratum. ``residual`` (queries, heads) float32: each first-key weight
    minus its head's mean in the query's stratum, so that a token's residual sum is
    S_ht - E[S_ht] (its count in every stratum is the same under every permutation).
    ``indices`` / ``indptr``: the token-by-query one-hot matrix (tested tokens only) in CSR
    form; a permutation o of the queries remaps its column indices (o[indices]), which sums
    the residuals of the queries the shuffle hands each token. ``inv_sd`` (tokens, heads):
    1 / sd(S_ht), with ``floor`` -inf where sd is 0 (the token fills its strata: no test)."""

    residual: np.ndarray
    stratum_key: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    inv_sd: np.ndarray
    floor: np.ndarray

    def statistic(self, order: np.ndarray) -> np.ndarray:
        """z (tokens, heads) with query q's label given to query order[q] (identity: the
        observed statistic)."""
        n_tokens, n_queries = len(self.indptr) - 1, len(order)
        one_hot = sparse.csr_matrix((np.ones(len(self.indices), dtype=np.float32),
                                     order[self.indices], self.indptr),
                                    shape=(n_tokens, n_queries))
        sums = np.asarray(one_hot @ self.residual)  # (tokens, heads): S - E[S]
        return -sums * self.inv_sd + self.floor


def _layout(values: np.ndarray, token_index: np.ndarray, strata: np.ndarray,
            n_tokens: int) -> _Layout:
    """values (queries, heads); token_index (queries,) in 0..n_tokens-1 or -1 (untested
    token); strata (queries,) integer labels. Inside stratum s with N_s queries (head mean
    m_hs, population variance v_hs) a token holding n_ts of them has
    Var(S_ht) = sum_s n_ts (N_s - n_ts) / (N_s - 1) v_hs (sampling without replacement)."""
    by_stratum = np.argsort(strata, kind="stable")
    values, token_index = values[by_stratum], token_index[by_stratum]
    _, stratum, size = np.unique(strata[by_stratum], return_inverse=True, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(size)[:-1]])
    mean = np.add.reduceat(values, starts, axis=0) / size[:, None]  # (strata, heads)
    residual = values - mean[stratum]
    var = np.add.reduceat(residual ** 2, starts, axis=0) / size[:, None]
    tested = token_index >= 0
    counts = np.zeros((n_tokens, len(size)))  # n_ts
    np.add.at(counts, (token_index[tested], stratum[tested]), 1.0)
    n_s = size[None, :].astype(float)
    fpc = np.divide(counts * (n_s - counts), n_s - 1, out=np.zeros_like(counts),
                    where=n_s > 1)
    sd = np.sqrt(np.maximum(fpc @ var, 0.0))
    spread = np.sqrt(var.max(axis=0, initial=0.0))[None, :]  # the head's largest stratum sd
    usable = sd > 1e-6 * spread  # below this the head is constant wherever the token can go
    inv_sd = np.divide(1.0, sd, out=np.zeros_like(sd), where=usable)
    rows = np.flatnonzero(tested)
    rows = rows[np.argsort(token_index[rows], kind="stable")]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(token_index[rows],
                                                         minlength=n_tokens))])
    return _Layout(residual=np.ascontiguousarray(residual, dtype=np.float32),
                   stratum_key=stratum.astype(float), indices=rows.astype(np.int64),
                   indptr=indptr.astype(np.int64), inv_sd=inv_sd.astype(np.float32),
                   floor=np.where(usable, 0.0, -np.inf).astype(np.float32))


def _null_maxima(layout: _Layout, n_perm: int, seed: int) -> np.ndarray:
    """max_t z_ht under n_perm within-stratum shuffles, (n_perm, heads). A shuffle is the
    argsort of stratum index + uniform noise: queries are sorted by stratum, so each stratum
    stays in place and is permuted uniformly at random. A batch of shuffles is one gather of
    the residuals each shuffle hands the tested queries and one segment sum per token (the
    same numbers as ``statistic`` applied shuffle by shuffle)."""
    rng = np.random.default_rng(seed)
    n_queries = len(layout.stratum_key)
    n_heads = layout.residual.shape[1]
    starts = layout.indptr[:-1]
    # shuffles per batch: at most BATCH, and their gathered residuals within GATHER_BYTES
    width = max(len(layout.indices) * n_heads * layout.residual.itemsize, 1)
    per_batch = int(max(1, min(BATCH, GATHER_BYTES // width)))
    out = np.empty((n_perm, n_heads))
    for start in range(0, n_perm, per_batch):
        b = min(per_batch, n_perm - start)
        orders = np.argsort(layout.stratum_key + rng.random((b, n_queries)), axis=1)
        gathered = layout.residual[orders[:, layout.indices]]  # (b, tested queries, heads)
        sums = np.add.reduceat(gathered, starts, axis=1)  # (b, tokens, heads): S - E[S]
        out[start:start + b] = (-sums * layout.inv_sd + layout.floor).max(axis=1)
    return out


def _exceed(null: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """(1 + #{b : null_b >= observed}) / (n + 1) per column; null (n, heads), observed
    (..., heads) -> p-values shaped like observed (ties within a relative _TIE count)."""
    n = null.shape[0]
    tol = _TIE * (1.0 + np.abs(observed))
    ranked = np.sort(null, axis=0)  # ascending per head
    out = np.empty(observed.shape)
    flat = observed.reshape(-1, observed.shape[-1])
    out_flat = out.reshape(flat.shape)
    for h in range(observed.shape[-1]):
        below = np.searchsorted(ranked[:, h], flat[:, h] - tol[..., h].reshape(-1), side="left")
        out_flat[:, h] = (1 + n - below) / (n + 1)
    return out


def scan(arrays: dict[str, np.ndarray], tokens: np.ndarray, positions: np.ndarray,
         probes: np.ndarray, decode: Callable[[int], str] | None = None,
         n_perm: int | None = None, alpha: float = ALPHA, method: str = "holm",
         within: str = "position", seed: int = 0, min_count: int = settings.MIN_COUNT,
         min_position: int = settings.MIN_POSITION, dormant_level: float = settings.DORMANT_LEVEL,
         dormant_share: float = settings.DORMANT_SHARE) -> TriggerScan:
    """Test every mostly dormant head for first-key drops at particular tokens.

    ``arrays``: ``lm.query_features`` output, (layers, heads, queries) each, padding removed;
    ``tokens``, ``positions``, ``probes``: (queries,) integer token id, position and probe of
    each query. Queries at positions < ``min_position`` are left out. A head is tested when at
    least ``dormant_share`` of its queries put >= ``dormant_level`` on the first key (0 tests
    every head; the gate reads only the weights, which the permutation leaves alone, so it does
    not bias the test). ``n_perm`` unset: ``N_PERM``, or more when the correction over the
    tested heads needs them (``perms_needed``); an explicit ``n_perm`` too small for Holm to
    ever reject is an error. See the module docstring for the statistic, null and correction.
    """
    _check(arrays, tokens, positions, probes, n_perm, alpha, method, within, min_count)
    tokens, positions, probes = (np.asarray(a) for a in (tokens, positions, probes))
    first = np.asarray(arrays["first"], dtype=np.float64)
    n_layers, n_heads, _ = first.shape
    keep = positions >= min_position
    flat_first = first.reshape(n_layers * n_heads, -1)[:, keep]
    share = (flat_first >= dormant_level).mean(axis=1) if keep.any() else \
        np.zeros(n_layers * n_heads)
    tested_heads = np.flatnonzero(share >= dormant_share) if keep.any() else \
        np.zeros(0, dtype=int)
    n_tested = len(tested_heads)
    if n_perm is None:
        n_perm = max(N_PERM, perms_needed(n_tested, alpha))
    n_perm = int(n_perm)
    min_p = 1.0 / (n_perm + 1)
    if method == "holm" and n_tested * min_p > alpha:
        raise TriggerScanError(
            f"n_perm = {n_perm} is too few for Holm's correction over {n_tested} heads (the "
            f"smallest p-value 1/{n_perm + 1} times {n_tested} exceeds alpha = {alpha:g}); use "
            f"n_perm >= {math.ceil(n_tested / alpha) - 1}, or leave it unset.")

    tok = tokens[keep]
    uniq, inverse, counts = np.unique(tok, return_inverse=True, return_counts=True)
    frequent = np.flatnonzero(counts >= min_count)
    token_index = np.full(len(uniq), -1)
    token_index[frequent] = np.arange(len(frequent))
    token_index = token_index[inverse]  # per kept query: its tested token's index, or -1
    strata = (positions if within == "position" else probes)[keep]

    p_head = np.ones(n_tested)
    z_obs = np.full((len(frequent), n_tested), -np.inf)
    null = np.full((n_perm, n_tested), -np.inf)
    if n_tested and len(frequent):
        layout = _layout(flat_first[tested_heads].T, token_index, strata, len(frequent))
        z_obs = layout.statistic(np.arange(len(layout.stratum_key))).astype(np.float64)
        null = _null_maxima(layout, n_perm, seed)
        p_head = _exceed(null, z_obs.max(axis=0))
    p_adj = adjust(p_head, method)
    level = levels(p_head, p_adj, alpha, method)

    heads = []
    for j in np.flatnonzero(p_adj <= alpha):
        p_tok = _exceed(null[:, j:j + 1], z_obs[:, j:j + 1])[:, 0]  # max-T over its tokens
        sig = np.flatnonzero(p_tok <= level[j])
        sig = sig[np.argsort(-z_obs[sig, j], kind="stable")]  # strongest drop first
        view = _HeadView(flat=int(tested_heads[j]), n_heads=n_heads, keep=keep, tok=tok,
                         strata=strata, probes=probes[keep])
        heads.append({"p_value": float(p_head[j]), "p_adjusted": float(p_adj[j]),
                      "level": float(level[j]), "statistic": float(z_obs[:, j].max()),
                      "dormant_share": float(share[view.flat]),
                      **view.report(arrays, uniq[frequent[sig]], z_obs[sig, j], p_tok[sig],
                                    decode)})
    heads.sort(key=lambda h: (h["p_adjusted"], -h["statistic"]))

    def grid(values: np.ndarray) -> list[list[float | None]]:
        full: list[float | None] = [None] * (n_layers * n_heads)
        for j, flat_index in enumerate(tested_heads):
            full[int(flat_index)] = float(values[j])
        return [full[i * n_heads:(i + 1) * n_heads] for i in range(n_layers)]

    return TriggerScan(
        heads=heads, p_values=grid(p_head), p_adjusted=grid(p_adj), n_layers=n_layers,
        n_heads=n_heads, n_tested=n_tested, n_queries=int(keep.sum()),
        n_probes=int(len(np.unique(probes[keep]))), n_tokens_tested=int(len(frequent)),
        n_perm=n_perm, min_p=min_p, min_adjusted_p=min(1.0, max(n_tested, 1) * min_p),
        alpha=alpha, method=method, within=within, seed=seed, min_count=int(min_count),
        min_position=min_position, dormant_level=dormant_level, dormant_share=dormant_share)


@dataclass
class _HeadView:
    """One kept head's queries (those at positions >= min_position), to describe it."""

    flat: int  # layer * n_heads + head
    n_heads: int
    keep: np.ndarray  # (queries,) bool: the queries the scan read
    tok: np.ndarray  # (kept,) their tokens
    strata: np.ndarray  # (kept,) their strata
    probes: np.ndarray  # (kept,) their probes

    def report(self, arrays: dict[str, np.ndarray], ids: np.ndarray, z: np.ndarray,
               p: np.ndarray, decode: Callable[[int], str] | None) -> dict[str, Any]:
        """Where the head sits, its trigger tokens ``ids`` (with their statistics ``z`` and
        p-values ``p``): count, mean first-key weight and the null's expectation of it (the
        mean over the token's occurrences of the head's mean in their strata), and where the
        triggered queries attend (``lm.describe_targets``)."""
        feats = {k: np.asarray(arrays[k]).reshape(-1, len(self.keep))[self.flat, self.keep]
                 for k in FEATURES}
        f = feats["first"].astype(np.float64)
        _, stratum, size = np.unique(self.strata, return_inverse=True, return_counts=True)
        stratum_mean = np.bincount(stratum, weights=f) / size
        hit = np.isin(self.tok, ids)
        tokens = []
        for i, z_i, p_i in zip(ids, z, p):
            at = self.tok == i
            tokens.append({"token": decode(int(i)) if decode is not None else None,
                           "id": int(i), "count": int(at.sum()),
                           "mean_first": float(f[at].mean()),
                           "expected_first": float(stratum_mean[stratum[at]].mean()),
                           "z": float(z_i), "p_value": float(p_i)})
        layer, head = divmod(self.flat, self.n_heads)
        return {"layer": layer, "head": head, "mean_first": float(f.mean()),
                "n_trigger_tokens": len(tokens), "n_triggered": int(hit.sum()),
                "n_probes_triggered": int(len(np.unique(self.probes[hit]))),
                "tokens": tokens,
                "when_triggered": lm.describe_targets({k: v[hit] for k, v in feats.items()})}


# ----------------------------------------------------------------------- targeted effect


def targeted_effect(loss_change: np.ndarray, is_trigger: np.ndarray,
                    valid: np.ndarray | None = None, seed: int = 0) -> dict[str, Any]:
    """An ablation's next-token loss change at trigger positions against the other positions.

    loss_change (probes, positions): the change in next-token loss from ablating a head;
    is_trigger (probes, positions) bool: the positions whose query is one of the head's
    trigger tokens; valid (probes, positions) bool, False at padding (default: all valid).
    Per probe, the mean change at its trigger positions and at its other positions; a probe
    without a trigger position (or without any other position) drops out. ``difference`` is
    the mean over the remaining probes of (trigger mean - other mean), with its one-sided 95%
    bootstrap bounds over probes (``head_sets.two_level`` with one head: probes, not
    positions, are the independent draws; nan with fewer than two probes).
    """
    change = np.asarray(loss_change, dtype=np.float64)
    trig = np.asarray(is_trigger)
    ok = np.ones(change.shape, dtype=bool) if valid is None else np.asarray(valid)
    if change.ndim != 2:
        raise TriggerScanError(f"loss_change must be (probes, positions), not shape "
                               f"{change.shape}.")
    for name, arr in (("is_trigger", trig), ("valid", ok)):
        if arr.shape != change.shape or arr.dtype != bool:
            raise TriggerScanError(f"{name} must be a bool array shaped like loss_change "
                                   f"{change.shape}, not {arr.dtype} {arr.shape}.")
    if not np.isfinite(change[ok]).all():
        raise TriggerScanError("loss_change must be finite at every valid position.")
    at, other = ok & trig, ok & ~trig
    n_at, n_other = at.sum(1), other.sum(1)
    used = (n_at > 0) & (n_other > 0)
    filled = np.where(ok, change, 0.0)
    mean_at = (filled * at).sum(1)[used] / n_at[used]
    mean_other = (filled * other).sum(1)[used] / n_other[used]
    diff = mean_at - mean_other
    lo, hi = (math.nan, math.nan)
    if len(diff) >= 2:
        draws = head_sets.two_level(diff[None, :], settings.BOOTSTRAP_DRAWS, seed=seed)
        lo, hi = (float(q) for q in np.quantile(draws, [ALPHA, 1 - ALPHA]))
    nan = math.nan
    return {
        "trigger_mean": float(mean_at.mean()) if len(diff) else nan,
        "other_mean": float(mean_other.mean()) if len(diff) else nan,
        "difference": float(diff.mean()) if len(diff) else nan,
        "interval": [lo, hi], "confidence": CONFIDENCE,
        "n_probes": int(used.sum()), "n_probes_dropped": int((~used).sum()),
        "n_trigger_positions": int(n_at[used].sum()),
        "n_other_positions": int(n_other[used].sum()),
    }
