"""``sinklab.theory.expressivity``: the table of verdicts, each construction's measured error
against its stated bound with a control that must fail, and the 1x1 sigmoid floor checked at
the sequences its proof uses."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from sinklab.attention import RULES, rule_info
from sinklab.config import RunConfig, TaskConfig, build_run_config
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import CONTENT_START, Batch
from sinklab.theory import expressivity as ex
from sinklab.theory import floors
from sinklab.theory import rule_constructions as rc
from sinklab.theory.capacity import CAPACITY
from sinklab.theory.constructions import (
    all_triggers_batch,
    construction_config,
    softmax_sink,
    zero_row_construction,
)

EXACT = [key for key, v in ex.EXPRESSIVITY.items() if v.how == ex.EXACT]
ANY_ERROR = [key for key, v in ex.EXPRESSIVITY.items() if v.how == ex.ANY_ERROR]
TASK = TaskConfig()  # the paper's sizes: L = 16, d = 16, triggers at 2..15


def _ids(keys):
    return [f"{config}-{rule}" for config, rule in keys]


def _under(cfg: RunConfig, model: AttentionStack, rule: str) -> tuple[RunConfig, AttentionStack]:
    """The same W_Q, W_K, W_V, W_O under another rule (its own parameters at their start)."""
    values = cfg.to_dict()
    values["model"]["attention"] = rule
    other_cfg = build_run_config(values)
    other = AttentionStack(other_cfg.model, cfg.task.d_model, residual=cfg.residual)
    other = other.to(model.blocks[0].attn.w_q.dtype)
    with torch.no_grad():
        for mine, theirs in zip(other.blocks, model.blocks):
            for name in ("w_q", "w_k", "w_v", "w_o"):
                getattr(mine.attn, name).copy_(getattr(theirs.attn, name))
    return other_cfg, other


def _linf(cfg: RunConfig, model: AttentionStack, n: int = 128, seed: int = 3) -> float:
    dtype = model.blocks[0].attn.w_q.dtype
    batch = all_triggers_batch(cfg, n, seed, dtype)
    with torch.no_grad():
        return (model(batch.x).out[0] - batch.y).abs().max().item()


# ------------------------------------------------------------------------------- the table


def test_the_table_gives_every_rule_a_verdict_in_both_configurations():
    assert set(ex.EXPRESSIVITY) == set(itertools.product(ex.CONFIGS, ex.TABLE_RULES))
    for rule in ex.TABLE_RULES:  # each one is sinklab's own registered rule
        assert rule in RULES and rule_info(rule).module == "sinklab"
    clipped = rule_info("clipped_softmax").kwargs  # the table's clipped_softmax is the default
    assert (clipped["zeta"].default, clipped["gamma"].default) == (rc.CLIP_ZETA, rc.CLIP_GAMMA)
    for verdict in ex.EXPRESSIVITY.values():
        if verdict.construction is not None:
            assert verdict.construction in rc.BUILDERS or \
                verdict.construction == "zero_row_construction"


def test_the_table_agrees_with_the_zoo_capacity_arguments():
    """Every zoo capacity argument is a "cannot" here under the same key, and every "cannot"
    here under one of the zoo's keys is in the zoo's table."""
    zoo_keys = {argument.key for argument in CAPACITY.values()}
    for key, argument in CAPACITY.items():
        assert ex.EXPRESSIVITY[key].verdict == "cannot"
        assert ex.EXPRESSIVITY[key].how == argument.key
    for key, verdict in ex.EXPRESSIVITY.items():
        if verdict.verdict == "cannot" and verdict.how in zoo_keys:
            assert CAPACITY[key].key == verdict.how


@pytest.mark.parametrize(("args", "message"), [
    (("maybe", ex.EXACT, None, "."), "Verdict.verdict='maybe' is not allowed"),
    (("can", "position_free", "softmax_construction", "."), "not allowed with verdict 'can'"),
    (("cannot", "pole_gap", "softmax_construction", "."), "goes with 'can' only"),
    (("can", ex.EXACT, None, "."), "goes with 'can' only"),
    (("unknown", ex.EXACT, None, "."), "not allowed with verdict 'unknown'"),
])
def test_a_verdict_refuses_what_does_not_fit(args, message):
    with pytest.raises(ValueError, match=message):
        ex.Verdict(*args)


def test_constructions_refuse_entries_without_one_and_a_wrong_strength():
    with pytest.raises(ConfigError, match="1x1 sigmoid has no construction: its verdict is "
                                          "'cannot' \\(pole_gap\\)"):
        ex.check_construction("1x1", "sigmoid")
    with pytest.raises(ConfigError, match="2x2 relu_raw has no construction: its verdict is "
                                          "'unknown' \\(open\\)"):
        ex.build_construction("2x2", "relu_raw")
    with pytest.raises(ConfigError, match="config='3x3' is not allowed"):
        ex.check_construction("3x3", "relu")
    with pytest.raises(ConfigError, match="c=4.0 is not allowed for 1x1 relu: its construction "
                                          "is exact, so c must be none"):
        ex.build_construction("1x1", "relu", 4.0)
    with pytest.raises(ConfigError, match="c must be a number"):
        ex.build_construction("1x1", "softmax1")


# ------------------------------------------------------------------------ the constructions


@pytest.mark.parametrize(("config", "rule"), EXACT, ids=_ids(EXACT))
def test_exact_constructions_are_exact_and_not_under_unscaled_relu(config, rule):
    """Zero error in float32 and float64 with no BOS weight; control: the same weights under
    raw ReLU (the trigger row sums the tokens instead of averaging them) err by >= 0.25."""
    points = ex.check_construction(config, rule, n_sequences=128)["points"]
    float32, float64 = points
    assert float32["dtype"] == "float32" and float32["linf"] <= 1e-5
    assert float64["dtype"] == "float64" and float64["linf"] <= 1e-10
    assert float64["head_bos_mass"] == 0.0
    cfg, model = ex.build_construction(config, rule)
    assert _linf(*_under(cfg, model, "relu_raw")) >= 0.25


@pytest.mark.parametrize(("config", "rule"), ANY_ERROR, ids=_ids(ANY_ERROR))
def test_constructions_to_any_error_fall_under_their_bound(config, rule):
    """At c = 4, 8, 16 the measured L-infinity error is at most the stated bound and at least
    half of it (the bound is the rate, not a loose cap), and below 1e-5 at c = 16. Only
    softmax and clipped softmax park their non-trigger rows on BOS (as the output sees the
    weights, after a gate); the others use their own way out."""
    points = ex.check_construction(config, rule, n_sequences=256)["points"]
    assert [p["c"] for p in points] == list(ex.STRENGTHS)
    for p in points:
        assert p["bound"] / 2 <= p["linf"] <= p["bound"]
    assert all(a["linf"] > b["linf"] for a, b in zip(points, points[1:]))
    assert points[-1]["linf"] <= 1e-5
    sinks = points[1]["head_bos_mass"]  # at c = 8
    assert (sinks >= 0.99) if rule in ("softmax", "clipped_softmax") else (sinks <= 1e-3)


@pytest.mark.parametrize(("config", "rule"), ANY_ERROR, ids=_ids(ANY_ERROR))
def test_constructions_to_any_error_fail_without_their_way_out(config, rule):
    """Control: softmax at c = 0 (no logit gap), and the other rules' weights at c = 8 under
    plain softmax (no zero logit, no learned logit, no gate) err by >= 0.25."""
    if rule == "softmax":
        assert _linf(*ex.build_construction(config, rule, 0.0)) >= 0.25
    else:
        cfg, model = ex.build_construction(config, rule, 8.0)
        assert _linf(cfg, model) <= 5e-3
        assert _linf(*_under(cfg, model, "softmax")) >= 0.25


def test_the_softmax_construction_is_the_sink_family():
    _, ours = rc.softmax_construction(6.0)
    _, family = softmax_sink(6.0)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        assert torch.equal(getattr(ours.blocks[0].attn, name), getattr(family.blocks[0].attn, name))


def test_constructions_set_only_the_first_head_of_a_2x2_stack():
    """Head 1 of layer 1 works and every other head is silent; the clipped construction, which
    needs two layers, uses head 1 of both."""
    for name, build in rc.BUILDERS.items():
        _, model = build(8.0, 16, 16, 2, 2)
        working = {(0, 0), (1, 0)} if name == "clipped_two_layer_construction" else {(0, 0)}
        for layer, block in enumerate(model.blocks):
            for head in range(2):
                silent = torch.all(block.attn.w_o[0, head] == 0).item()
                assert silent == ((layer, head) not in working), name


def _batch(cfg: RunConfig, n: int = 128, seed: int = 3) -> Batch:
    """Float64 sequences with triggers anywhere in 2..L-1."""
    return all_triggers_batch(cfg, n, seed, torch.float64)


@pytest.mark.parametrize("layers", [1, 2], ids=["1x1", "2x2"])
def test_the_gated_dim_construction_is_the_headwise_one(layers):
    """A gate replicated on every dimension gives the headwise construction's outputs; control:
    one content dimension's gate left closed at the trigger row loses that coordinate there."""
    cfg, model = rc.gated_dim_construction(8.0, n_layers=layers, n_heads=layers)
    _, headwise = rc.gated_construction(8.0, n_layers=layers, n_heads=layers)
    batch = _batch(cfg)
    with torch.no_grad():
        out = model(batch.x).out[0]
        torch.testing.assert_close(out, headwise(batch.x).out[0], rtol=1e-12, atol=1e-12)
        model.blocks[0].attn.rule.gate_w[0, 0, :, CONTENT_START] = 0.0
        broken = model(batch.x).out[0]
    assert (broken - batch.y).abs().max().item() >= 0.25


def test_the_kv_bias_construction_is_softmax1_s_with_a_learned_sink():
    """The learned key takes all but (i + 1) / (e^c + i + 1) of every non-trigger row and only
    1 / (2 + j e^c) of the trigger row, and the outputs are softmax1's; control:
    with the learned key at 0 it is no sink (a score of 0 like every key's) and the model errs."""
    c = 8.0
    cfg, model = rc.kv_bias_construction(c)
    _, softmax1 = rc.softmax1_construction(c)
    batch = _batch(cfg)
    with torch.no_grad():
        out = model(batch.x, return_weights=True)
        torch.testing.assert_close(out.out[0], softmax1(batch.x).out[0], rtol=1e-12, atol=1e-12)
        learned = 1 - out.patterns[0][0, :, 0].sum(-1)  # (B, L): the learned key's weight
        rows = torch.arange(16)
        trigger = rows[None] == batch.trigger[:, None]
        assert learned[~trigger].min().item() >= 1 - 16 / (math.exp(c) + 16)
        assert learned[trigger].max().item() <= 1 / (2 + 2 * math.exp(c)) * (1 + 1e-9)
        model.blocks[0].attn.rule.key.zero_()
    assert _linf(cfg, model) >= 0.25


def test_the_two_clipped_layers_scales_multiply_to_one_plus_one_over_j():
    """(1 + nu A_r(j)) (1 + mu A_0(j)) = 1 + 1/j at every trigger position the construction
    allows (L <= 28), with every weight between the clips; controls: the quadratic's other root
    gives r < -1 (no score gap makes it), and the construction without its second layer errs
    by at least 0.25, like any one clipped layer of this kind."""
    nu, r, mu = rc.clipped_two_layer_scales()
    j = np.arange(2, 28, dtype=float)
    first, second = floors.clipped_weight(r, j), floors.clipped_weight(0.0, j)
    assert np.all((first > 0) & (second > 0) & (first < 1) & (second < 1))
    np.testing.assert_allclose((1 + nu * first) * (1 + mu * second), 1 + 1 / j, rtol=1e-14)
    kappa = (rc.CLIP_ZETA - rc.CLIP_GAMMA) / -rc.CLIP_GAMMA
    a = (2 * kappa + 1 + np.sqrt(4 * kappa + 1)) / (2 * kappa)  # the other root
    b = kappa * (1 - a)
    assert b * b / (b - a) < -1
    cfg, model = rc.clipped_two_layer_construction(8.0)
    assert _linf(cfg, model) <= 1e-3
    with torch.no_grad():
        model.blocks[1].attn.w_o.zero_()
    assert _linf(cfg, model) >= 0.25
    with pytest.raises(ConfigError, match="seq_len <= 28"):
        rc.clipped_two_layer_construction(8.0, seq_len=29)
    with pytest.raises(ConfigError, match="needs two layers"):
        rc.clipped_two_layer_construction(8.0, n_layers=1, n_heads=1)


# ------------------------------------------------------------------- the 1x1 sigmoid floor


def test_the_sigmoid_floor_is_the_linear_programme_s_optimum():
    """sigmoid_floor's triple search against scipy's LP over every trigger position: min
    sum |l_k| k (k + 1)^2 / (k - 1) subject to sum l_k k^e = 0^e, e = 0, 1, 2."""
    found = floors.sigmoid_floor(TASK)
    assert found.nodes == (2, 5, 15) and found.exact == Fraction(7, 705)
    for power, value in ((0, 1), (1, 0), (2, 0)):  # the weights evaluate quadratics at 0
        assert sum(w * k ** power for w, k in zip(found.weights, found.nodes)) == value
    k = np.arange(2, 16, dtype=float)
    cost = k * (k + 1) ** 2 / (k - 1)
    a = np.vstack([k ** 0, k, k ** 2])
    lp = linprog(np.r_[cost, cost], A_eq=np.hstack([a, -a]), b_eq=[1, 0, 0],
                 bounds=(0, None))
    assert lp.status == 0 and 1 / lp.fun == pytest.approx(found.floor, rel=1e-9)
    assert floors.sigmoid_floor(construction_config("sigmoid", seq_len=4).task) is None


def _best_fit(nodes: tuple[int, ...], r_plus: float, r_minus: float) -> float:
    """min over alpha, beta of max_j (j - 1) |alpha / (j + 1 + r+) + beta / (j + 1 + r-) - 1/j|
    (a linear programme in alpha, beta and the max)."""
    j = np.asarray(nodes, dtype=float)
    f = np.c_[(j - 1) / (j + 1 + r_plus), (j - 1) / (j + 1 + r_minus), -np.ones_like(j)]
    g = (j - 1) / j
    lp = linprog([0, 0, 1], A_ub=np.r_[f, -f * [1, 1, -1]], b_ub=np.r_[g, -g],
                 bounds=[(None, None), (None, None), (0, None)])
    return lp.fun


def test_the_argument_s_functions_never_beat_the_floor_and_nearly_reach_it():
    """The proof's second step on its own: over a grid of poles r+, r- the best alpha, beta
    stay at or above the floor, and poles near -1 (r -> 0) come within 1% of it: the constant
    is the right one for these functions."""
    found = floors.sigmoid_floor(TASK)
    grid = [0.0, 1e-3, 0.1, 1.0, 10.0, 1e3]
    fits = [_best_fit(found.nodes, a, b) for a, b in itertools.combinations_with_replacement(
        grid, 2)]
    assert min(fits) >= found.floor * (1 - 1e-9)
    assert _best_fit(found.nodes, 1e-4, 2e-4) <= found.floor * 1.01


def _random_1x1(rule: str, members: int, seed: int) -> tuple[RunConfig, AttentionStack]:
    """1x1 models of a parameter-free rule with N(0, s^2) weights, s from 0.1 to 3 across the
    members."""
    cfg = construction_config(rule)
    model = AttentionStack(cfg.model, 16, residual=False, n_members=members).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-1, 0.5, members, dtype=torch.float64)[:, None, None, None]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)
    return cfg, model


def test_the_pair_identity_holds_for_random_sigmoid_weights():
    """The proof's first step: the trigger-row difference between the two signs, in the chosen
    content coordinate, is 2 (j - 1) h(j), with h from the weights alone (BOS's and the
    trigger's own terms cancel). Random models with weights over a 30x range of scales."""
    cfg, model = _random_1x1("sigmoid", 32, seed=0)
    nodes = floors.sigmoid_floor(cfg.task).nodes
    batch = floors.floor_sequences(cfg.task, nodes)
    with torch.no_grad():
        out = model(batch.x).out  # (E, 6, L, d)
    rows = torch.arange(len(nodes)) * 2
    at = out[:, :, :, CONTENT_START][:, torch.arange(6), batch.trigger]  # (E, 6)
    diff = at[:, rows] - at[:, rows + 1]  # (E, nodes): sign + minus sign -
    j = torch.tensor(nodes, dtype=torch.float64)
    torch.testing.assert_close(diff, 2 * (j - 1) * floors.pair_h(model, cfg.task, nodes),
                               rtol=1e-10, atol=1e-12)


def _optimised_sigmoid(batch, steps: int, members: int = 8) -> AttentionStack:
    """1x1 sigmoid models trained by Adam on a smooth maximum of their error on ``batch``."""
    _, model = _random_1x1("sigmoid", members, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(steps):
        err = (model(batch.x).out - batch.y).abs().flatten(1)  # (E, everything)
        loss = (torch.logsumexp(200 * err, dim=1) / 200).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_no_sigmoid_weights_beat_the_floor_while_relu_and_one_position_do():
    """At the argument's six sequences: random and Adam-optimised 1x1 sigmoid weights all err
    by at least the floor, and their pair bound (a lower bound on that error) is itself at
    least the floor. Controls on the same sequences: the exact ReLU construction errs by 0, and
    sigmoid_one_position(j) solves the two sequences with the trigger at j far below the floor
    (one trigger position is no obstacle) while erring above it on the six."""
    found = floors.sigmoid_floor(TASK)
    batch = floors.floor_sequences(TASK, found.nodes)
    for model in (_random_1x1("sigmoid", 64, seed=2)[1], _optimised_sigmoid(batch, steps=150)):
        with torch.no_grad():
            errors = (model(batch.x).out - batch.y).abs().flatten(1).amax(dim=1)
        bound = floors.pair_bound(model, TASK, found.nodes)
        assert torch.all(bound <= errors * (1 + 1e-12))
        assert torch.all(bound >= found.floor)
    check = floors.check_sigmoid_floor()
    assert check["floor"] == found.floor and check["relu_error"] <= 1e-12
    for entry in check["one_position"]:
        assert entry["error_at_j"] <= found.floor * 1e-6
        assert entry["error_all"] >= found.floor


# ------------------------------------------------------------ the 1x1 clipped-softmax floor


def test_the_clipped_floor_is_certified_and_its_text_quotes_it():
    """clipped_floor's interval bound is at most the best fit it finds and within 0.1% of it,
    the exact fits (the pair formula) agree with scipy's LP and stay at or above the floor on a
    fine grid of score gaps, and the argument quotes the floor rounded down. Control: with
    gamma = 0 (plain softmax) the same fit is 0 at r = 0 (the sink): no offset, no floor."""
    found = floors.clipped_floor(TASK)
    assert found.positions == tuple(range(2, 16))
    assert 0.1033 <= found.floor <= found.attained <= found.floor * (1 + 1e-3)
    quoted = f"r = {found.r:.2f}, mu = {found.mu:.2f},\nwhich errs by {found.attained:.4f}"
    assert "F = 0.1033 (" in floors.CLIPPED_1X1_ARGUMENT and quoted in floors.CLIPPED_1X1_ARGUMENT
    j = np.asarray(found.positions, dtype=float)
    for r in (-0.9, 0.0, found.r, 10.0, 19.0):
        a = floors.clipped_weight(r, j)
        f = np.c_[(j - 1) * a, -np.ones_like(j)]  # (j - 1) |mu a - 1/j| <= E in mu and E
        g = (j - 1) / j
        lp = linprog([0, 1], A_ub=np.r_[f, -f * [1, -1]], b_ub=np.r_[g, -g],
                     bounds=[(0, None), (0, None)])
        assert lp.status == 0 and floors.clipped_fit(found.positions, r)[0] == pytest.approx(lp.fun)
    beyond = 1.03 / 0.03 - 15
    grid = np.r_[np.linspace(-1, beyond, 3001), found.r + np.linspace(-0.01, 0.01, 201)]
    assert min(floors.clipped_fit(found.positions, r)[0] for r in grid) >= found.floor
    assert floors.clipped_fit(found.positions, 0.0, gamma=0.0)[0] <= 1e-15
    assert floors.clipped_floor(TASK, gamma=0.0) is None
    assert floors.clipped_floor(construction_config("clipped_softmax", seq_len=4).task) is None


def test_the_clipped_pair_identity_holds_for_random_weights_and_needs_the_orthogonal_w():
    """The proof's first step: for random clipped-softmax weights the trigger-row difference
    between the two signs, in coordinate m, is 2 (j - 1) w_m mu A(j), from the weights alone.
    Control: with content +-e_0 instead (a direction the trigger's query sees) the signs score
    their content keys differently and 2 (j - 1) M_00 A(j) is off."""
    members = 16
    cfg, model = _random_1x1("clipped_softmax", members, seed=4)
    attn = model.blocks[0].attn
    positions = tuple(range(2, 16))
    seqs = floors.clipped_sequences(model, cfg.task, positions)
    g = (attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2))[:, 1, CONTENT_START:15]
    assert (seqs.w * g).sum(-1).abs().max().item() < 1e-12  # w is orthogonal to g
    j = torch.tensor(positions, dtype=torch.float64)
    every = torch.arange(members)

    def differences(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = model(x).out  # (E, 2 * positions, L, d)
        rows = torch.arange(len(seqs.trigger))
        at = out[every[:, None], rows, seqs.trigger, CONTENT_START + m[:, None]]
        return at[:, 0::2] - at[:, 1::2]  # (E, positions): sign + minus sign -

    wm = seqs.w[every, seqs.m][:, None]
    torch.testing.assert_close(differences(seqs.x, seqs.m),
                               2 * (j - 1) * wm * floors.clipped_pair(model, cfg.task, positions),
                               rtol=1e-10, atol=1e-12)
    plain = seqs.x.clone()  # the same sequences with content s e_0
    content = torch.arange(16)[None] != seqs.trigger[:, None]
    content[:, 0] = False
    plain[..., CONTENT_START:15] = 0.0
    plain[..., CONTENT_START] = seqs.sign[:, None] * content
    m00 = (attn.w_v[:, 0] @ attn.w_o[:, 0])[:, CONTENT_START, CONTENT_START][:, None]
    naive = 2 * (j - 1) * m00 * floors.clipped_content_weight(model, cfg.task, positions)
    zero = torch.zeros(members, dtype=torch.long)
    assert (differences(plain, zero) - naive).abs().max().item() > 1e-2


def _optimised_clipped(task: TaskConfig, positions: tuple[int, ...], steps: int,
                       members: int = 8) -> AttentionStack:
    """1x1 clipped-softmax models trained by Adam on a smooth maximum of their error on their
    own argument sequences (``clipped_sequences``, redrawn from the weights at every step)."""
    _, model = _random_1x1("clipped_softmax", members, seed=5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(steps):
        seqs = floors.clipped_sequences(model, task, positions)
        err = (model(seqs.x).out - seqs.y).abs().flatten(1)  # (E, everything)
        loss = (torch.logsumexp(200 * err, dim=1) / 200).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_no_clipped_weights_beat_the_floor_while_one_position_and_softmax_do():
    """On each model's own argument sequences: random and Adam-optimised 1x1 clipped-softmax
    weights all err by at least the floor, and their pair bound (a lower bound on that error)
    is itself at least the floor. Controls on such sequences: the softmax sink construction errs
    far below the floor (no offset), and clipped_one_position(j) solves random sequences with
    the trigger at j to rounding, with non-trigger rows exactly 0, while erring above the floor
    over every position."""
    found = floors.clipped_floor(TASK)
    positions = found.positions
    optimised = _optimised_clipped(TASK, positions, steps=150)
    for model in (_random_1x1("clipped_softmax", 64, seed=6)[1], optimised):
        seqs = floors.clipped_sequences(model, TASK, positions)
        with torch.no_grad():
            errors = (model(seqs.x).out - seqs.y).abs().flatten(1).amax(dim=1)
        bound = floors.clipped_pair_bound(model, TASK, positions)
        assert torch.all(bound <= errors * (1 + 1e-12))
        assert torch.all(bound >= found.floor)
    check = floors.check_clipped_floor()
    assert check["floor"] == found.floor and check["softmax_error"] <= found.floor * 1e-6
    for entry in check["one_position"]:
        assert entry["error_at_j"] <= 1e-12 and entry["nontrigger_max"] == 0.0
        assert entry["error_all"] >= found.floor
    with pytest.raises(ConfigError, match="clip to zero only from c = 3.536"):
        rc.clipped_one_position(2, c=3.0)


def test_trained_style_models_never_beat_the_arguments_floors_and_other_weights_can():
    """``argument_errors``: random models of each rule err by at least its floor on the
    argument's sequences; the controls, weights of a rule the argument does not cover (the
    exact ReLU construction, the softmax sink), err by almost nothing on the same sequences."""
    for rule, key, floor in (("sigmoid", "pole_gap", 7 / 705), ("clipped_softmax",
                                                                "clip_offset", 0.1033)):
        cfg = build_run_config({"model": {"attention": rule}})
        model = AttentionStack(cfg.model, 16, residual=False, n_members=3)
        for e in range(3):
            model.init_member(e, torch.Generator().manual_seed(e))
        assert min(floors.argument_errors(model, cfg.task, key)) >= floor
    cfg, relu = zero_row_construction("relu", dtype=torch.float64)
    assert floors.argument_errors(relu, cfg.task, "pole_gap") == [0.0]
    cfg, sink = softmax_sink(30.0)
    assert floors.argument_errors(sink, cfg.task, "clip_offset")[0] < 1e-9
    with pytest.raises(ValueError, match="choose pole_gap, clip_offset or bos_denied"):
        floors.argument_errors(sink, cfg.task, "position_free")


def test_one_layer_with_bos_removed_errs_by_a_fifth_and_the_controls_do_not():
    """``removed_errors``: random 1x1 models of each forced rule with BOS removed err by at
    least 1/5 on the argument's sequences; the controls: the softmax sink's weights with BOS
    visible, and the exact ReLU weights with BOS removed, err by almost nothing there, while the
    same sink weights with BOS removed err by 1."""
    from sinklab.model import AttentionStack

    def removed(rule, state=None):
        cfg = build_run_config({"model": {"attention": rule, "bos": "removed"}})
        model = AttentionStack(cfg.model, 16, residual=False, n_members=1 if state else 3)
        if state is None:
            for e in range(3):
                model.init_member(e, torch.Generator().manual_seed(e))
        else:
            model = model.double()
            model.load_state_dict(state)
        return cfg, model

    for rule in floors.REMOVED_FORCED_RULES:
        cfg, model = removed(rule)
        assert min(floors.removed_errors(model, cfg.task)) >= floors.REMOVED_FLOOR
    cfg, sink = softmax_sink(30.0)
    assert floors.removed_errors(sink, cfg.task)[0] < 1e-9  # BOS visible: the sink solves them
    cfg, denied = removed("softmax", sink.state_dict())
    assert floors.removed_errors(denied, cfg.task)[0] >= floors.REMOVED_FLOOR
    _, relu = zero_row_construction("relu", dtype=torch.float64)
    cfg, relu_removed = removed("relu", relu.state_dict())
    assert floors.removed_errors(relu_removed, cfg.task) == [0.0]
    with pytest.raises(ValueError, match="four content coordinates"):
        floors.removed_sequences(build_run_config({"task": {"d_model": 6}}).task)


def test_one_softmax_layer_with_bos_capped_errs_by_eps_over_eps_plus_4():
    """``denied_floor`` capped: random 1x1 softmax models and the sink's weights with BOS's
    share capped at 1 - eps err by at least eps / (eps + 4) on the argument's sequences; the
    control, the same sink weights with BOS visible, errs by almost nothing there. No floor is
    claimed for rules the arguments do not cover."""
    from sinklab.model import AttentionStack

    _, sink = softmax_sink(30.0)
    for eps in (0.01, 0.1):
        floor = floors.denied_floor("softmax", "capped", eps)
        assert floor == pytest.approx(eps / (eps + 4))
        cfg = build_run_config({"model": {"bos": "capped", "bos_cap_eps": eps}})
        model = AttentionStack(cfg.model, 16, residual=False, n_members=3)
        for e in range(3):
            model.init_member(e, torch.Generator().manual_seed(e))
        assert min(floors.removed_errors(model, cfg.task)) >= floor
        capped = AttentionStack(cfg.model, 16, residual=False).double()
        capped.load_state_dict(sink.state_dict())
        assert floors.removed_errors(capped, cfg.task)[0] >= floor
    assert floors.removed_errors(sink, build_run_config({}).task)[0] < floor  # BOS visible
    assert floors.denied_floor("softmax", "removed") == floors.REMOVED_FLOOR
    assert floors.denied_floor("relu", "removed") is None
    assert floors.denied_floor("clipped_softmax", "capped", 0.1) is None
