"""Denying the first key (sinklab.first_key): the toy models' ``model.bos`` and the real-model
interventions are one implementation, so a toy model denied its BOS key equals the visible model
with the intervention hooks; and the row operations keep their edge cases on any leading axes:
rows whose other keys carry no weight, rows under the cap, row sums, and a row mask."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import DOCS
from sinklab import first_key as fk
from sinklab.attention import causal_mask
from sinklab.config import ModelConfig, TaskConfig
from sinklab.hooks import Hooks
from sinklab.lm import interventions as iv
from sinklab.model import AttentionStack
from sinklab.task import TRIGGER, sample_batch

SEQ, D, MEMBERS = 8, 6, 3
LEADING = {"rows": (), "heads": (3,), "batch-heads": (2, 3), "members-batch-heads": (2, 2, 3)}


def _pair(bos: str, rule: str = "softmax") -> tuple[AttentionStack, AttentionStack]:
    """A 2-layer, 2-head ensemble denied BOS as ``bos`` says, and the same weights visible."""
    # init 0.5: rows heavy on BOS for the cap to act on, yet no other key's softmax weight
    # underflows to 0 (where the pattern has nothing left to renormalise over, the two differ)
    cfg = ModelConfig(attention=rule, n_layers=2, n_heads=2, init_std=0.5, bos=bos,
                      bos_cap_eps=0.3)
    denied = AttentionStack(cfg, D, residual=True, n_members=MEMBERS)
    for e in range(MEMBERS):
        denied.init_member(e, torch.Generator().manual_seed(e))
    visible = AttentionStack(dataclasses.replace(cfg, bos="visible"), D, residual=True,
                             n_members=MEMBERS)
    visible.load_state_dict(denied.state_dict())
    return denied, visible


def _no_trigger() -> torch.Tensor:
    """Inputs (B, T, d) whose trigger flag is off everywhere: every query but BOS's is denied,
    as the interventions deny every row (query 0 sees only key 0, which they leave alone)."""
    cfg = TaskConfig(seq_len=SEQ, d_model=D, eval_trigger=3)
    x = sample_batch(cfg, 5, torch.Generator().manual_seed(0), residual=True).x.clone()
    x[..., TRIGGER] = 0
    return x


def _causal(*leading: int, rule: str = "softmax", seed: int = 0, bos: float = 0.0
            ) -> torch.Tensor:
    """Weights (*leading, SEQ, SEQ) of a causal rule on random scores, ``bos`` added to key
    0's."""
    scores = torch.randn(*leading, SEQ, SEQ, generator=torch.Generator().manual_seed(seed)) * 3
    scores[..., 0] += bos
    mask = causal_mask(SEQ)
    if rule == "relu":
        return torch.relu(scores).masked_fill(~mask, 0.0)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


# ------------------------------------------------------------------ the two users agree


def test_an_ablated_softmax_model_is_the_visible_one_with_the_first_key_hidden():
    denied, visible = _pair("ablated")
    x = _no_trigger()
    want = denied(x, return_weights=True)
    got = visible(x, return_weights=True, hooks=iv.hide_first_key(2))
    # -inf at key 0 before the softmax vs the softmax renormalised after it: float32 rounding
    for g, w in zip([got.out, *got.patterns], [want.out, *want.patterns]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert (want.patterns[0][..., 1:, 0] == 0).all()  # every query but BOS's denied
    assert not torch.allclose(visible(x).out, want.out)  # the denial changed something


def test_an_ablated_relu_model_is_not_renormalised():
    """For a rule that does not normalise, masking the score is not hiding the weight: the
    other keys' ReLU weights stay as they were, where the pattern hook would rescale them."""
    denied, visible = _pair("ablated", rule="relu")
    x = _no_trigger()
    masked = denied(x, return_weights=True).patterns[0]
    keep = Hooks(keep=["blocks.0.attn.pattern"])  # the folded products, as the denied model's
    plain = visible(x, return_weights=True, hooks=keep).patterns[0]
    assert torch.equal(masked[..., 1:, 1:], plain[..., 1:, 1:])
    assert torch.equal(masked[..., 1:, 0], torch.zeros_like(masked[..., 1:, 0]))
    renormalised = visible(x, return_weights=True, hooks=iv.hide_first_key(2)).patterns[0]
    assert not torch.allclose(renormalised, masked)


def test_a_capped_softmax_model_is_the_visible_one_with_the_first_mass_capped():
    denied, visible = _pair("capped")
    x = _no_trigger()
    want = denied(x, return_weights=True)
    got = visible(x, return_weights=True, hooks=iv.cap_first_mass(0.3, 2))
    # eps S rounded as S - (1 - eps) S (the interventions) vs eps * S (model.bos)
    for g, w in zip([got.out, *got.patterns], [want.out, *want.patterns]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    # with model.bos's rounding and its visible keys, the same numbers
    same = fk.cap_first_mass(0.3, 2, visible=causal_mask(SEQ), excess="product")
    exact = visible(x, return_weights=True, hooks=same)
    assert all(torch.equal(g, w) for g, w in zip([exact.out, *exact.patterns],
                                                 [want.out, *want.patterns]))
    assert (want.patterns[0][..., 0] > 0.7 + 1e-6).sum() == MEMBERS * x.shape[0] * 2  # BOS's row
    assert not torch.allclose(visible(x).out, want.out)  # the cap changed something


# ------------------------------------------------------------------ the row operations


@pytest.mark.parametrize("leading", LEADING.values(), ids=list(LEADING))
def test_hide_first_renormalises_and_leaves_rows_with_nothing_else(leading):
    w = _causal(*leading)
    hidden = fk.hide_first(w)
    torch.testing.assert_close(hidden.sum(-1), w.sum(-1))  # row sums kept
    assert (hidden[..., 1:, 0] == 0).all()
    torch.testing.assert_close(hidden[..., 1:, 1:],
                               w[..., 1:, 1:] / w[..., 1:, 1:].sum(-1, keepdim=True))
    assert torch.equal(hidden[..., 0, :], w[..., 0, :])  # query 0 sees only key 0
    r = _causal(*leading, rule="relu")
    r[..., 4, 1:] = 0  # a ReLU row on key 0 alone
    assert torch.equal(fk.hide_first(r)[..., 4, :], r[..., 4, :])


@pytest.mark.parametrize("leading", LEADING.values(), ids=list(LEADING))
@pytest.mark.parametrize("eps", [0.1, 0.5])
def test_cap_first_caps_keeps_sums_and_leaves_rows_under_the_cap(leading, eps):
    w = _causal(*leading, rule="relu")
    w[..., 2, :2] = torch.tensor([100.0, 1.0])  # far over the cap
    capped = fk.cap_first(w, eps)
    total = w.sum(-1)
    torch.testing.assert_close(capped.sum(-1), total)
    over = (w[..., 0] > (1 - eps) * total) & (w[..., 1:].sum(-1) > 0)
    assert over[..., 2].all()
    torch.testing.assert_close(capped[..., 0][over], (1 - eps) * total[over])
    assert torch.equal(capped[~over], w[~over])  # under the cap, or nothing else to give to
    share = w[..., 1:] / w[..., 1:].sum(-1, keepdim=True).clamp(min=1e-30)
    torch.testing.assert_close(capped[..., 1:][over], (eps * total[..., None] * share)[over])


def test_cap_first_leaves_rows_whose_other_keys_carry_no_weight_unless_it_knows_the_keys():
    w = _causal(2, 3, rule="relu")
    w[..., 4, 1:] = 0.0  # key 0 alone, with keys 1..4 visible
    w[..., 4, 0] = 2.0
    w[..., 0, 0] = 2.0  # query 0: key 0 is the only visible key
    assert torch.equal(fk.cap_first(w, 0.2)[..., 4, :], w[..., 4, :])
    shared = fk.cap_first(w, 0.2, visible=causal_mask(SEQ))
    torch.testing.assert_close(shared[..., 4, :5], torch.tensor([1.6, 0.1, 0.1, 0.1, 0.1])
                               .expand(2, 3, 5))
    assert torch.equal(shared[..., 4, 5:], w[..., 4, 5:])  # future keys stay 0
    assert torch.equal(shared[..., 0, :], w[..., 0, :])  # nobody to share with: left as it is
    torch.testing.assert_close(shared.sum(-1), w.sum(-1))


@pytest.mark.parametrize("operation", ["mask", "hide", "cap"])
@pytest.mark.parametrize("leading", LEADING.values(), ids=list(LEADING))
def test_a_row_mask_denies_only_the_flagged_rows(operation, leading):
    scores = torch.randn(*leading, SEQ, SEQ, generator=torch.Generator().manual_seed(3)) * 3
    scores[..., 0] += 3.0  # rows heavy on key 0, over the cap
    rows = torch.rand(*leading, SEQ, generator=torch.Generator().manual_seed(4)) > 0.5
    rows[..., 0] = False  # query 0 sees only key 0
    rows[..., 1] = True
    w = scores.masked_fill(~causal_mask(SEQ), float("-inf")).softmax(-1)
    if operation == "mask":
        edited = fk.mask_first(scores, rows)
        assert torch.equal(edited[rows][..., 0], torch.full_like(edited[rows][..., 0],
                                                                 float("-inf")))
        assert torch.equal(edited[rows][..., 1:], scores[rows][..., 1:])
        assert torch.equal(edited[~rows], scores[~rows])
        return
    base = fk.hide_first(w) if operation == "hide" else fk.cap_first(w, 0.4)
    edited = fk.hide_first(w, rows) if operation == "hide" else fk.cap_first(w, 0.4, rows)
    assert torch.equal(edited[rows], base[rows])
    assert torch.equal(edited[~rows], w[~rows])
    assert not torch.equal(edited[rows], w[rows])


def test_the_builders_edit_only_the_heads_asked_for_with_rows_for_every_head():
    w = _causal(2, 4, bos=3.0)
    rows = torch.zeros(2, 1, SEQ, dtype=torch.bool)  # (B, 1, Q): every head alike
    rows[:, :, 3:] = True
    for hooks, op in ((fk.hide_first_key(1, heads=[1, 2], rows=rows),
                       lambda p: fk.hide_first(p, rows)),
                      (fk.cap_first_mass(0.5, 1, heads=[1, 2], rows=rows),
                       lambda p: fk.cap_first(p, 0.5, rows))):
        edited = hooks("blocks.0.attn.pattern", w)
        assert torch.equal(edited[:, [1, 2]], op(w)[:, [1, 2]])
        assert torch.equal(edited[:, [0, 3]], w[:, [0, 3]])
        assert not torch.equal(edited, w)
    masked = fk.mask_first_key(1, rows=rows)("blocks.0.attn.scores", torch.zeros(2, 4, SEQ, SEQ))
    assert torch.equal(masked, fk.mask_first(torch.zeros(2, 4, SEQ, SEQ), rows))
    with pytest.raises(ValueError, match="excess='even' is not a rounding"):
        fk.cap_first_mass(0.5, 1, excess="even")


def test_the_two_roundings_of_the_excess_are_the_ones_named():
    """``model.bos`` rounds the excess as eps * S, the interventions as S - (1 - eps) S: each
    user keeps its own numbers, and the two do differ in the last bits."""
    w = _causal(4, 3, bos=3.0)
    eps = 0.3
    total = w[..., 0] + w[..., 1:].sum(-1)
    rest = w[..., 1:].sum(-1)
    over = (w[..., 0] > (1 - eps) * total) & (rest > 0)
    for excess, given in (("product", eps * total), ("difference", total - (1 - eps) * total)):
        capped = fk.cap_first(w, eps, excess=excess)
        assert torch.equal(capped[..., 1:][over], (w[..., 1:] * (given / rest)[..., None])[over])
    assert not torch.equal(fk.cap_first(w, eps, excess="product"),
                           fk.cap_first(w, eps, excess="difference"))


# ------------------------------------------------------------- query 0 keeps its only key


@pytest.mark.parametrize("rule", ["softmax", "relu"])
@pytest.mark.parametrize("leading", LEADING.values(), ids=list(LEADING))
def test_masking_the_first_key_leaves_query_0_its_only_key(leading, rule):
    """A causal model's query 0 sees only key 0: masked there, a softmax row would be NaN. It
    keeps key 0, flagged or not, and its row stays as the rule gives it."""
    from sinklab.attention import build_rule

    scores = torch.randn(*leading, SEQ, SEQ, generator=torch.Generator().manual_seed(6)) * 3
    scores[..., 0, 0] = 2.0  # query 0 has weight on key 0 to lose, under ReLU too
    weights = build_rule(rule, 1, 1, D)
    mask = causal_mask(SEQ)
    plain = weights(scores, mask)
    for rows in (None, torch.ones(*leading, SEQ, dtype=torch.bool)):
        masked = weights(fk.mask_first(scores, rows), mask)
        assert torch.isfinite(masked).all()
        assert torch.equal(masked[..., 0, :], plain[..., 0, :])
        assert (masked[..., 1:, 0] == 0).all()


@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_a_toy_model_with_its_first_key_masked_stays_finite(rule):
    """Every row denied key 0 in both layers of a 2x2 model: query 0 keeps it, so nothing is
    NaN (a NaN at query 0 of layer 0 would reach every row of layer 1 through key 0)."""
    _, visible = _pair("visible", rule)
    x = _no_trigger()
    plain = visible(x, return_weights=True)
    masked = visible(x, return_weights=True, hooks=fk.mask_first_key(2))
    assert torch.isfinite(masked.out).all()
    first = masked.patterns[0]
    assert torch.equal(first[..., 0, :], plain.patterns[0][..., 0, :])
    assert (first[..., 1:, 0] == 0).all() and not torch.equal(masked.out, plain.out)


# ------------------------------------------------------------- docs/api.md's example


def test_api_docs_first_key_example_runs_and_says_what_its_prose_says(tmp_path, monkeypatch,
                                                                      capsys):
    """docs/api.md's first-key example, run as written: the softmax model's non-trigger error
    grows by orders of magnitude with the first key hidden or its mass capped, and barely moves
    with BOS's weight zeroed; no edit changes the ReLU model's (its prose says so in words)."""
    import re

    page = (DOCS / "api.md").read_text()
    section = page.split("### Does the sink matter?", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/api.md", "exec"), {})
    printed = capsys.readouterr().out
    error = {(rule, what.strip()): float(value) for rule, what, value in re.findall(
        r"^(\w+) +(.+?) +non-trigger L-inf error (\S+)$", printed, re.MULTILINE)}
    assert len(error) == 8, printed
    trained = error["softmax", "as trained"]
    assert 0 < trained < 0.01
    assert error["softmax", "first weight zeroed"] < 10 * trained
    for edit in ("first key hidden", "first mass capped at 0.5"):
        assert error["softmax", edit] > 100 * trained
    assert len({v for (rule, _), v in error.items() if rule == "relu"}) == 1
