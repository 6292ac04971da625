"""The worst-case attack (``sinklab.theory.attack``): exact values where theory knows the supremum,
never below a random sample, witnesses that reproduce, starts honoured, bad arguments refused,
and every kind of model the repo trains."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from helpers import small_config
from sinklab.attention import RULES
from sinklab.config import RunConfig
from sinklab.model import AttentionStack
from sinklab.task import encode, targets
from sinklab.theory import attack as attack_module
from sinklab.theory import constructions as theory
from sinklab.theory.attack import KINDS, WorstCase, _length_free, attack

SEQ, D = 8, 6  # small enough that a full attack takes a fraction of a second


def random_model(cfg: RunConfig, seed: int = 0, std: float = 0.5) -> AttentionStack:
    """A one-member model of ``cfg`` with N(0, std^2) weights: large enough to be non-linear."""
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model


def config(**model) -> RunConfig:
    return small_config(task={"seq_len": SEQ, "d_model": D}, model=model)


def row_kind(i: int, j: int) -> str:
    return "bos" if i == 0 else "pre" if i < j else "trigger" if i == j else "post"


def sampled_errors(model: AttentionStack, cfg: RunConfig, n: int, seed: int
                   ) -> dict[str, list[float]]:
    """The largest row error over ``n`` random task sequences, per row type and position
    (NaN where the sample has no such row)."""
    batch = theory.all_triggers_batch(cfg, n, seed)
    with torch.no_grad():
        err = (copy.deepcopy(model).double()(batch.x).out[0] - batch.y).abs().amax(-1)
    found = {k: [math.nan] * cfg.task.seq_len for k in KINDS}
    for row, j in zip(err.tolist(), batch.trigger.tolist()):
        for i, e in enumerate(row):
            kind = row_kind(i, j)
            if math.isnan(found[kind][i]) or e > found[kind][i]:
                found[kind][i] = e
    return found


def row_error(model: AttentionStack, cfg: RunConfig, content: torch.Tensor, j: int,
              i: int) -> torch.Tensor:
    """y_i - target_i (d,) of one input, computed by a float64 copy of the model."""
    x = encode(content.to(torch.float64)[None], torch.tensor([j]))
    with torch.no_grad():
        out = copy.deepcopy(model).double()(x).out[0]
    return (out - targets(x, torch.tensor([j]), cfg.residual))[0, i]


def assert_witnesses_reproduce(worst: WorstCase, model: AttentionStack, cfg: RunConfig) -> None:
    checked = 0
    for kind in KINDS:
        for i, (value, w) in enumerate(zip(worst.error[kind], worst.witness[kind])):
            assert (w is None) == math.isnan(value)
            if w is None:
                continue
            assert row_kind(i, w["trigger"]) == kind
            e = row_error(model, cfg, torch.tensor(w["content"], dtype=torch.float64), w["trigger"],
                          i)
            assert e.abs().max().item() == pytest.approx(value, rel=1e-12, abs=1e-15)
            assert w["sign"] * e[w["coordinate"]].item() == pytest.approx(value, rel=1e-12,
                                                                          abs=1e-15)
            checked += 1
    assert checked > 0


# ------------------------------------------------------------------ exact where theory knows


@pytest.mark.parametrize("c", [0.5, 3.0])
def test_sink_family_pre_rows_are_exact(c):
    # At a pre row i the family outputs (1 - b_i) mean(x_1..x_i), b_i = e^c / (e^c + i), for
    # every input, and the bias flag's mean is exactly 1: the supremum error is 1 - b_i.
    cfg, model = theory.softmax_sink(c)
    seq_len = cfg.task.seq_len
    worst = attack(model, cfg, steps=5, triggers=[seq_len - 1])
    for i in range(1, seq_len - 1):
        exact = 1 - math.exp(c) / (math.exp(c) + i)
        assert worst.error["pre"][i] == pytest.approx(exact, rel=1e-9)
    assert math.isnan(worst.error["pre"][0]) and math.isnan(worst.error["pre"][seq_len - 1])
    assert worst.max("pre") == pytest.approx(1 - math.exp(c) / (math.exp(c) + seq_len - 2),
                                             rel=1e-9)


@pytest.mark.parametrize(("layers", "heads"), [(1, 1), (2, 2)])
def test_relu_construction_has_no_error_under_attack(layers, heads):
    cfg, model = theory.relu_construction(SEQ, D, layers, heads, dtype=torch.float64)
    worst = attack(model, cfg, steps=20)
    for kind in ("bos", "pre", "post"):  # every non-trigger row exactly zero (or x) for all x
        assert all(e == 0.0 for e in worst.error[kind] if not math.isnan(e))
    assert 0.0 <= worst.max("trigger") <= 1e-12
    assert_witnesses_reproduce(worst, model, cfg)


# ------------------------------------------------------------------ a lower bound, searched


@pytest.mark.parametrize(("layers", "heads"), [(1, 1), (2, 2)], ids=["1x1", "2x2-residual"])
def test_attack_is_never_below_a_random_sample(layers, heads):
    cfg = config(n_layers=layers, n_heads=heads)
    assert cfg.residual == (layers > 1)
    model = random_model(cfg, seed=layers)
    worst = attack(model, cfg, steps=30)
    sample = sampled_errors(model, cfg, 2000, seed=1)
    for kind in KINDS:
        for i, (found, seen) in enumerate(zip(worst.error[kind], sample[kind])):
            assert math.isnan(found) == math.isnan(seen), (kind, i)
            assert math.isnan(seen) or found >= seen, (kind, i, found, seen)
    # the ascent matters: summed over positions, it beats its own starts by a clear margin
    starts_only = attack(model, cfg, steps=0)
    for kind in ("pre", "trigger", "post"):
        total = sum(e for e in worst.error[kind] if not math.isnan(e))
        assert total > 1.05 * sum(e for e in starts_only.error[kind] if not math.isnan(e))


def test_witnesses_reproduce_and_the_callers_model_is_untouched():
    cfg = config(n_layers=2, n_heads=2)
    model = random_model(cfg, seed=3)
    before = copy.deepcopy(model.state_dict())
    worst = attack(model, cfg, steps=10)
    assert_witnesses_reproduce(worst, model, cfg)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for name, p in model.state_dict().items():
        assert torch.equal(p, before[name])
    for kind in ("pre", "trigger", "post"):  # every witness lies in the task's input set
        for w in worst.witness[kind]:
            if w is not None:
                content = torch.tensor(w["content"])
                assert content.shape == (SEQ, D - 3) and content.abs().max() <= 1
                assert torch.all(content[0] == 0)  # BOS carries no content
                assert 2 <= w["trigger"] <= SEQ - 1


def test_row_types_follow_the_trigger_positions():
    cfg = config()
    model = random_model(cfg)
    worst = attack(model, cfg, steps=2)
    last = SEQ - 1
    assert worst.triggers == list(range(2, SEQ))
    assert [not math.isnan(e) for e in worst.error["bos"]] == [True] + [False] * last
    assert [not math.isnan(e) for e in worst.error["pre"]] == [False] + [True] * (last - 1) \
        + [False]
    assert [not math.isnan(e) for e in worst.error["trigger"]] == [False] * 2 + [True] * (last - 1)
    assert [not math.isnan(e) for e in worst.error["post"]] == [False] * 3 + [True] * (last - 2)
    cheap = attack(model, cfg, steps=2, triggers=[last])  # pre rows and the last trigger row
    assert cheap.triggers == [last]
    assert all(math.isnan(e) for e in cheap.error["post"])
    assert [not math.isnan(e) for e in cheap.error["trigger"]] == [False] * last + [True]
    assert all(not math.isnan(e) for e in cheap.error["pre"][1:last])
    middle = attack(model, cfg, steps=2, triggers=[3, 5])  # pre rows below the largest only
    assert [not math.isnan(e) for e in middle.error["pre"]] == [False] + [True] * 4 \
        + [False] * 3
    assert {w["trigger"] for w in middle.witness["pre"] if w} == {5}
    assert [not math.isnan(e) for e in middle.error["post"]] == [False] * 4 + [True] * 4


def test_starts_are_honoured():
    cfg = config(n_layers=2, n_heads=2)
    model = random_model(cfg, seed=5)
    long = attack(model, cfg, steps=40)
    kind = "post"
    i = long.argmax(kind)
    w = long.witness[kind][i]
    start = torch.tensor(w["content"], dtype=torch.float64)[None]
    plain = attack(model, cfg, steps=0, restarts=1, seed=1)
    given = attack(model, cfg, steps=0, restarts=1, seed=1, starts=start)
    assert plain.error[kind][i] < long.error[kind][i]  # random starts alone fall short here
    assert given.error[kind][i] >= long.error[kind][i] * (1 - 1e-12)
    assert given.n_starts == 1
    # and at every row type and position, at least the start's own error
    for k in KINDS:
        for r, value in enumerate(given.error[k]):
            if math.isnan(value):
                continue
            js = [SEQ - 1] if k in ("bos", "pre") else [r] if k == "trigger" else range(2, r)
            own = max(row_error(model, cfg, start[0], j, r).abs().max().item() for j in js)
            assert value >= own * (1 - 1e-12), (k, r)


def test_to_dict_is_json_and_keeps_contents_where_asked():
    cfg = config()
    worst = attack(random_model(cfg), cfg, steps=2)
    for contents, expected in (("none", 0), ("max", len(KINDS)), ("all", None)):
        d = worst.to_dict(contents)
        json.dumps(d, allow_nan=False)  # NaN became None
        with_content = [(k, i) for k in KINDS for i, w in enumerate(d["witness"][k])
                        if w is not None and "content" in w]
        if expected is None:
            assert len(with_content) == sum(w is not None for k in KINDS
                                            for w in worst.witness[k])
        else:
            assert len(with_content) == expected
        if contents == "max":
            assert sorted(with_content) == sorted((k, worst.argmax(k)) for k in KINDS)
    d = worst.to_dict()
    assert d["max"] == {k: worst.max(k) for k in KINDS}
    assert d["error"]["post"][0] is None
    with pytest.raises(ValueError, match="contents='some' is not allowed"):
        worst.to_dict("some")  # type: ignore[arg-type]


# ------------------------------------------------------------------ every model the repo trains


MODELS = {
    **{f"rule-{name}": {"attention": name} for name in sorted(RULES)},
    "2x2": {"n_layers": 2, "n_heads": 2},
    "bos-removed": {"bos": "removed"},
    "bos-capped": {"bos": "capped", "bos_cap_eps": 0.2},
    "bos-ablated-relu": {"attention": "relu", "bos": "ablated"},
    "standard-2x1": {"block": "standard", "n_layers": 2},
}


@pytest.mark.parametrize("model_cfg", MODELS.values(), ids=MODELS.keys())
def test_attack_runs_on_every_kind_of_model(model_cfg):
    cfg = config(**model_cfg)
    model = random_model(cfg, std=0.3)
    worst = attack(model, cfg, steps=10)
    for kind in KINDS:
        assert all(e >= 0 and math.isfinite(e) for e in worst.error[kind] if not math.isnan(e))
    assert_witnesses_reproduce(worst, model, cfg)
    sample = sampled_errors(model, cfg, 500, seed=2)
    for kind in KINDS:
        assert worst.max(kind) >= max(e for e in sample[kind] if not math.isnan(e)) * (1 - 1e-12)


@pytest.mark.parametrize("model_cfg", [{"n_layers": 2, "n_heads": 2}, {"attention": "relu_len"}],
                         ids=["2x2", "relu_len"])
def test_results_do_not_depend_on_the_chunks(monkeypatch, model_cfg):
    # One chunk holds every run here, so it is searched on whole sequences; chunks of 100 runs
    # are searched on prefixes where the rows ignore the length, and must find the same inputs
    # (the starts are the same numbers), to rounding. ReLU / L's rows depend on the length: its
    # chunks must be searched whole.
    cfg = config(**model_cfg)
    model = random_model(cfg, seed=4)
    whole = attack(model, cfg, steps=10)
    monkeypatch.setattr(attack_module, "MAX_BATCH", 100)
    chunked = attack(model, cfg, steps=10)
    for kind in KINDS:
        assert chunked.error[kind] == pytest.approx(whole.error[kind], rel=1e-9, nan_ok=True)


@pytest.mark.parametrize(("rule", "free"), [("softmax", True), ("relu", True),
                                            ("sigmoid", True), ("relu_len", False)])
def test_search_is_truncated_only_for_rows_that_ignore_the_length(rule, free):
    # ReLU / L divides every row by the sequence's length: its rows on a prefix differ.
    cfg = config(attention=rule)
    net = copy.deepcopy(random_model(cfg)).double()
    assert _length_free(net, cfg) is free


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"steps": -1}, "steps=-1 is not allowed"),
    ({"steps": 2.5}, "steps=2.5 is not allowed"),
    ({"restarts": 0}, "restarts=0 is not allowed"),
    ({"triggers": [1]}, "trigger position 1 is not allowed"),
    ({"triggers": [2, SEQ]}, f"trigger position {SEQ} is not allowed"),
    ({"triggers": []}, "an empty list of trigger positions is not allowed"),
    ({"starts": torch.zeros(1, SEQ, D)}, r"starts of shape \(1, 8, 6\) are not allowed"),
    ({"starts": torch.full((1, SEQ, D - 3), 1.5)}, "starts are not allowed outside"),
    ({"starts": [[0.0] * (D - 3)] * SEQ}, "starts of type list are not allowed"),
    ({"dtype": torch.int64}, "dtype=torch.int64 is not allowed"),
])
def test_bad_arguments_are_refused_in_one_sentence(kwargs, message):
    cfg = config()
    with pytest.raises(ValueError, match=message) as info:
        attack(random_model(cfg), cfg, **kwargs)
    text = str(info.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0


def test_model_and_config_must_match():
    cfg = config()
    other = small_config(task={"seq_len": SEQ, "d_model": D + 1})
    with pytest.raises(ValueError, match="d_model=6 but the config task.d_model=7"):
        attack(random_model(cfg), other)
    ensemble = AttentionStack(cfg.model, D, residual=False, n_members=2)
    with pytest.raises(ValueError, match="ensemble of 2 members"):
        attack(ensemble, cfg)
    worst = attack(random_model(cfg), cfg, steps=1)
    with pytest.raises(ValueError, match="row type 'middle' is not known"):
        worst.max("middle")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_attack_runs_on_the_models_device():
    cfg = config(n_layers=2, n_heads=2)
    model = random_model(cfg, seed=7)
    on_gpu = attack(model.cuda(), cfg, steps=10)
    assert_witnesses_reproduce(on_gpu, model.cpu(), cfg)


def test_row_objective_finds_the_family_supremum_too():
    """per_coordinate=False (one objective per row: its L-inf error) finds the sink family's
    exact pre-row supremum 1 - b_i as the per-coordinate search does."""
    c = 3.0
    cfg, model = theory.softmax_sink(c)
    worst = attack(model, cfg, steps=30, restarts=2, triggers=[cfg.task.seq_len - 1],
                   per_coordinate=False)
    for i in range(1, cfg.task.seq_len - 1):
        exact = 1 - math.exp(c) / (math.exp(c) + i)
        assert worst.error["pre"][i] == pytest.approx(exact, rel=1e-9)
