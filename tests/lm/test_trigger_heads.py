"""The trigger-head scan with its permutation null (sinklab.lm.trigger_heads) on synthetic query
arrays: planted heads are found at the p-value floor, unplanted ones are not (and false finds
over many seeds stay within the correction), position effects are not taken for token
effects, the null's moments are exact; and targeted_effect on constructed loss changes."""

from __future__ import annotations

import numpy as np
import pytest

from sinklab.errors import SinklabError
from sinklab.lm import loading as lm
from sinklab.lm import settings, trigger_heads
from sinklab.lm.trigger_heads import FEATURES, TriggerScanError, scan, targeted_effect

N_PROBES, N_POSITIONS, VOCAB = 40, 32, 50  # queries at positions 1..N_POSITIONS
PLANTED = (7, 11)  # the planted trigger tokens
LOW, HIGH = 0.1, 0.95  # first-key weight at a trigger / elsewhere


def _layout(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens, positions, probes (queries,), probe-major; tokens drawn with Zipf-like
    frequencies so that some are common and many rare."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, VOCAB + 1)
    tokens = rng.choice(VOCAB, N_PROBES * N_POSITIONS, p=weights / weights.sum())
    positions = np.tile(np.arange(1, N_POSITIONS + 1), N_PROBES)
    probes = np.repeat(np.arange(N_PROBES), N_POSITIONS)
    return tokens.astype(np.int64), positions, probes


def _arrays(tokens: np.ndarray, seed: int, layers: int = 2, heads: int = 3,
            planted: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Every head's first-key weight is HIGH plus a little noise, except at the trigger
    queries, where it is LOW. The trigger queries are the planted tokens' occurrences for the
    ``planted`` (layer, head), and the same number of queries drawn at random for every other
    head: the same marginal distribution, no token effect."""
    rng = np.random.default_rng(seed)
    shape = (layers, heads, len(tokens))
    arrays = {k: rng.uniform(0, 0.05, shape) for k in FEATURES}
    arrays["offset"] = rng.integers(1, 4, shape).astype(float)
    first = np.clip(rng.normal(HIGH, 0.02, shape), 0, 1)
    n_low = int(np.isin(tokens, PLANTED).sum())
    for layer in range(layers):
        for head in range(heads):
            if (layer, head) == planted:
                low = np.isin(tokens, PLANTED)
                arrays["prev"][layer, head, low] = 0.85  # the planted head reads the previous
            else:
                low = np.zeros(len(tokens), dtype=bool)
                low[rng.choice(len(tokens), n_low, replace=False)] = True
            first[layer, head, low] = np.clip(rng.normal(LOW, 0.02, low.sum()), 0, 1)
    arrays["first"] = first
    return arrays


def _p_values(result: trigger_heads.TriggerScan) -> np.ndarray:
    return np.array([p for row in result.p_values for p in row if p is not None])


def test_a_planted_head_is_found_with_its_tokens_at_the_p_value_floor():
    tokens, positions, probes = _layout(0)
    arrays = _arrays(tokens, 1, planted=(1, 2))
    result = scan(arrays, tokens, positions, probes, decode=lambda i: f"tok{i}", n_perm=199)
    assert result.n_tested == 6 and result.n_perm == 199 and result.min_p == 1 / 200
    assert [(h["layer"], h["head"]) for h in result.heads] == [(1, 2)]
    head = result.heads[0]
    assert head["p_value"] == result.min_p and head["p_adjusted"] <= result.alpha
    assert sorted(t["id"] for t in head["tokens"]) == sorted(PLANTED)
    kept = positions >= settings.MIN_POSITION
    for t in head["tokens"]:
        assert t["token"] == f"tok{t['id']}"
        assert t["count"] == ((tokens == t["id"]) & kept).sum()
        assert t["mean_first"] == pytest.approx(LOW, abs=0.02)
        assert t["expected_first"] > 0.8 and t["p_value"] <= head["level"]
    assert head["n_triggered"] == (np.isin(tokens, PLANTED) & kept).sum()
    assert head["when_triggered"]["kind"] == "previous token"


def test_unplanted_arrays_give_nothing():
    tokens, positions, probes = _layout(2)
    result = scan(_arrays(tokens, 3), tokens, positions, probes, n_perm=199)
    assert result.heads == [] and result.n_tested == 6


def test_false_finds_over_seeds_stay_within_the_correction():
    # 12 heads without a token effect, 20 data sets: Holm keeps the chance of any find per
    # data set at 5%, so 4 or more data sets with a find out of 20 would happen with
    # probability below 2%; without the correction about half the data sets would have one
    finds = 0
    for seed in range(20):
        tokens, positions, probes = _layout(100 + seed)
        arrays = _arrays(tokens, 200 + seed, layers=4, heads=3)
        result = scan(arrays, tokens, positions, probes, n_perm=499, seed=seed)
        assert result.n_tested == 12
        finds += bool(result.heads)
    assert finds <= 3


def test_p_values_lie_between_the_floor_and_one():
    tokens, positions, probes = _layout(4)
    for planted in (None, (0, 1)):
        result = scan(_arrays(tokens, 5, planted=planted), tokens, positions, probes,
                      n_perm=99, method="bh")
        p = _p_values(result)
        adjusted = np.array([q for row in result.p_adjusted for q in row if q is not None])
        assert len(p) == 6 and ((p >= 1 / 100) & (p <= 1)).all()
        assert ((adjusted >= p) & (adjusted <= 1)).all()


def test_a_position_effect_is_not_taken_for_a_token_effect_when_positions_are_kept():
    # head (0, 0) drops its first-key weight at the last positions, whatever the token; one
    # token occurs only there. Shuffling within positions sees no token effect; shuffling
    # within probes moves the token to early positions and so "finds" it
    tokens, positions, probes = _layout(6)
    late = positions > N_POSITIONS - 4
    late_token = VOCAB  # a token of its own, at half of the late queries
    tokens = np.where(late & (np.arange(len(tokens)) % 2 == 0), late_token, tokens)
    arrays = _arrays(tokens, 7)
    arrays["first"][0, 0] = np.where(late, 0.3, HIGH) + np.random.default_rng(8).normal(
        0, 0.02, len(tokens))
    kept = scan(arrays, tokens, positions, probes, n_perm=199, within="position")
    assert kept.heads == [] and kept.p_values[0][0] > 0.1
    shuffled = scan(arrays, tokens, positions, probes, n_perm=199, within="probe")
    assert [(h["layer"], h["head"]) for h in shuffled.heads] == [(0, 0)]
    assert shuffled.heads[0]["tokens"][0]["id"] == late_token


def test_a_statistic_every_permutation_reproduces_has_p_value_one():
    # one stratum, ten tokens of three queries each, one low query: whichever token a shuffle
    # gives it, the max statistic is the same, so the observed one is not unusual at all
    tokens = np.repeat(np.arange(10), 3)
    positions, probes = np.full(30, 10), np.arange(30)
    arrays = {k: np.zeros((1, 1, 30)) for k in FEATURES}
    arrays["first"][:] = HIGH
    arrays["first"][0, 0, 4] = LOW
    result = scan(arrays, tokens, positions, probes, n_perm=99)
    assert result.p_values == [[1.0]] and result.heads == []


def test_the_null_moments_are_exact():
    # under shuffles within strata each token's standardised statistic has mean 0, variance 1
    rng = np.random.default_rng(9)
    strata = rng.integers(0, 5, 300)
    token_index = rng.integers(-1, 6, 300)
    values = rng.beta(5, 1, (300, 2))
    layout = trigger_heads._layout(values, token_index, strata, 6)
    orders = np.argsort(layout.stratum_key + rng.random((4000, 300)), axis=1)
    z = np.stack([layout.statistic(o) for o in orders])  # (perms, tokens, heads)
    assert np.abs(z.mean(0)).max() < 0.1 and np.abs(z.var(0) - 1).max() < 0.1


def test_the_same_seed_gives_the_same_scan_and_another_seed_another():
    tokens, positions, probes = _layout(10)
    arrays = _arrays(tokens, 11, planted=(0, 2))
    one = scan(arrays, tokens, positions, probes, n_perm=199, seed=3)
    assert one.to_dict() == scan(arrays, tokens, positions, probes, n_perm=199, seed=3).to_dict()
    other = scan(arrays, tokens, positions, probes, n_perm=199, seed=4)
    assert not np.array_equal(_p_values(one), _p_values(other))


def test_unset_n_perm_is_enough_for_the_correction():
    tokens, positions, probes = _layout(12)
    arrays = _arrays(tokens, 13, layers=3, heads=4, planted=(2, 3))
    result = scan(arrays, tokens, positions, probes, dormant_share=0)
    assert result.n_perm == max(trigger_heads.N_PERM,
                                trigger_heads.perms_needed(12, result.alpha))
    assert result.min_adjusted_p <= result.alpha / trigger_heads.HEADROOM
    # the planted head comes first (a chance find among the other 11 is allowed: 5% FWER)
    assert (result.heads[0]["layer"], result.heads[0]["head"]) == (2, 3)
    assert result.heads[0]["p_value"] == result.min_p


def test_targeted_effect_recovers_a_constructed_difference():
    # 6 probes: trigger positions lose 0.5 more than the others on average over probes (per
    # probe 0.5 + spread), the others vary around each probe's base; a seventh probe has no
    # trigger position and drops out; padding (nan, invalid) is ignored
    n_probes, n_positions = 7, 10
    base = np.arange(n_probes)[:, None] * 0.3
    wiggle = np.where(np.arange(n_positions) % 2 == 0, 0.1, -0.1)[None, :]
    extra = np.array([-0.2, -0.1, 0.0, 0.1, 0.2, 0.0, 0.0]) + 0.5
    is_trigger = np.zeros((n_probes, n_positions), dtype=bool)
    is_trigger[:6, [3, 7]] = True
    change = base + np.where(is_trigger, extra[:, None], wiggle)
    valid = np.ones_like(is_trigger)
    valid[:, -1] = False
    change[:, -1] = np.nan
    wiggle_mean = wiggle[0, [0, 1, 2, 4, 5, 6, 8]].mean()
    out = targeted_effect(change, is_trigger, valid)
    assert out["n_probes"] == 6 and out["n_probes_dropped"] == 1
    assert out["n_trigger_positions"] == 12 and out["n_other_positions"] == 6 * 7
    assert out["difference"] == pytest.approx(0.5 - wiggle_mean)
    assert out["trigger_mean"] - out["other_mean"] == pytest.approx(out["difference"])
    lo, hi = out["interval"]
    assert lo < out["difference"] < hi and hi - lo < 0.5


def test_targeted_effect_without_usable_probes_is_nan():
    out = targeted_effect(np.zeros((3, 4)), np.zeros((3, 4), dtype=bool))
    assert out["n_probes"] == 0 and np.isnan(out["difference"])


@pytest.mark.parametrize("kwargs, needle", [
    ({"n_perm": 0}, "n_perm must be a whole number of at least 1"),
    ({"n_perm": 99.5}, "n_perm must be a whole number of at least 1"),
    ({"alpha": 0.0}, "alpha must lie strictly between 0 and 1"),
    ({"alpha": 1.5}, "alpha must lie strictly between 0 and 1"),
    ({"method": "bonferroni"}, "method 'bonferroni' is unknown; choose one of holm, bh"),
    ({"within": "layer"}, "within 'layer' is unknown; choose one of position, probe"),
    ({"min_count": 0}, "min_count must be a whole number of at least 1"),
    ({"n_perm": 20}, "too few for Holm's correction over 6 heads"),
])
def test_bad_arguments_raise_one_sentence(kwargs, needle):
    tokens, positions, probes = _layout(14)
    with pytest.raises(TriggerScanError, match=needle) as err:
        scan(_arrays(tokens, 15), tokens, positions, probes, **kwargs)
    assert isinstance(err.value, SinklabError)
    message = str(err.value)
    assert message.endswith(".") and "\n" not in message and message.count(". ") == 0


def test_bad_arrays_raise_one_sentence():
    tokens, positions, probes = _layout(16)
    arrays = _arrays(tokens, 17)
    with pytest.raises(TriggerScanError, match="lack entropy"):
        scan({k: v for k, v in arrays.items() if k != "entropy"}, tokens, positions, probes)
    with pytest.raises(TriggerScanError, match="positions must be one value per query"):
        scan(arrays, tokens, positions[:-1], probes)
    with pytest.raises(TriggerScanError, match="is_trigger must be a bool array"):
        targeted_effect(np.zeros((2, 3)), np.zeros((2, 3)))


# ------------------------------------------- a tiny model with a trigger head planted by a hook

PLANTED_HEAD = (1, 2)  # (layer, head) of the tiny Llama whose pattern the hook rewrites
TRIGGER_IDS = (7, 9)  # the token ids at which the planted head leaves the first key


def _planted_pattern(ids, triggered: bool):
    """A pattern hook: head PLANTED_HEAD[1] puts 0.95 on the first key and spreads the rest
    evenly, except (when ``triggered``) at queries holding a trigger token, where it averages
    the keys before it, as the paper's trigger head does."""
    import torch

    def hook(pattern, name):
        seq = pattern.shape[-1]
        causal = torch.ones(seq, seq).tril()
        spread = causal.clone()
        spread[:, 0] = 0
        spread = spread / spread.sum(-1, keepdim=True).clamp(min=1)
        dormant = 0.05 * spread
        dormant[:, 0] += 0.95 - 0.05 * (spread.sum(-1) == 0)  # query 0 sees only key 0
        dormant[0, 0] = 1.0
        rows = dormant.expand(pattern.shape[0], seq, seq).clone()
        if triggered:
            hit = torch.isin(ids, torch.tensor(TRIGGER_IDS))  # (B, T) queries at a trigger
            mean = causal / causal.sum(-1, keepdim=True)
            rows = torch.where(hit[..., None], mean.expand_as(rows), rows)
        edited = pattern.clone()
        edited[:, PLANTED_HEAD[1]] = rows
        return edited
    return hook


@pytest.mark.parametrize("triggered", [True, False], ids=["planted", "unplanted"])
def test_the_finder_on_a_tiny_model_with_a_planted_trigger_head(triggered):
    import torch

    import helpers
    from sinklab.hooks import Hooks
    from sinklab.lm import capture

    model = helpers.hf_model("llama")
    gen = torch.Generator().manual_seed(0)
    n_probes, seq = 40, 32
    ids = torch.randint(3, 120, (n_probes, seq), generator=gen)
    ids[:, 0] = 1  # BOS
    plant = torch.rand(n_probes, seq, generator=gen) < 0.08
    ids[plant & (torch.arange(seq) > 0)] = torch.tensor(TRIGGER_IDS)[torch.randint(
        2, (int((plant & (torch.arange(seq) > 0)).sum()),), generator=gen)]
    name = f"blocks.{PLANTED_HEAD[0]}.attn.pattern"
    hooks = Hooks({name: _planted_pattern(ids, triggered)}, keep=[
        f"blocks.{layer}.attn.pattern" for layer in range(2)])
    capture.run(model, ids, hooks=hooks)
    weights = torch.stack([hooks.cache[f"blocks.{layer}.attn.pattern"] for layer in range(2)])
    arrays = {k: v.numpy() for k, v in lm.query_features(weights).items()}
    tokens = ids[:, 1:].reshape(-1).numpy()
    positions = np.tile(np.arange(1, seq), n_probes)
    probes = np.repeat(np.arange(n_probes), seq - 1)
    found = trigger_heads.scan(arrays, tokens, positions, probes, seed=0)
    assert found.n_tested == 1  # only the planted head is mostly dormant
    if triggered:
        assert [(h["layer"], h["head"]) for h in found.heads] == [PLANTED_HEAD]
        assert {t["id"] for t in found.heads[0]["tokens"]} == set(TRIGGER_IDS)
    else:
        assert found.heads == []


def test_the_batched_null_equals_the_statistic_shuffle_by_shuffle():
    tokens, positions, probes = _layout(20)
    arrays = _arrays(tokens, 21, planted=(1, 1))
    first = arrays["first"].reshape(6, -1).T  # (queries, heads)
    uniq, inverse, counts = np.unique(tokens, return_inverse=True, return_counts=True)
    frequent = np.flatnonzero(counts >= 3)
    index = np.full(len(uniq), -1)
    index[frequent] = np.arange(len(frequent))
    layout = trigger_heads._layout(first, index[inverse], positions, len(frequent))
    batched = trigger_heads._null_maxima(layout, 150, seed=5)  # several batches of shuffles
    rng = np.random.default_rng(5)
    one_by_one = []
    while len(one_by_one) < 150:  # the same shuffles, drawn as the batches draw them
        b = min(trigger_heads.BATCH, 150 - len(one_by_one))
        orders = np.argsort(layout.stratum_key + rng.random((b, len(first))), axis=1)
        one_by_one.extend(layout.statistic(o).max(axis=0) for o in orders)
    assert np.allclose(batched, np.asarray(one_by_one), atol=1e-5)


def test_the_finder_shuffles_at_least_ten_thousand_times_by_default():
    assert trigger_heads.N_PERM >= 10_000
    tokens, positions, probes = _layout(22)
    found = scan(_arrays(tokens, 23, planted=(0, 1)), tokens, positions, probes)
    assert found.n_perm >= 10_000 and found.min_p == 1 / (found.n_perm + 1)
