"""The pretraining run's rate schedules and precisions (sinklab.pretrain.runconfig, training)."""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import ConfigError
from sinklab.pretrain.runconfig import PretrainConfig, flops_per_token, from_dict, step_flops
from sinklab.pretrain.training import MIN_LR_SHARE, autocast, build, lr_at, read_curve, train

TINY = dict(corpus="pydoc", d_model=16, n_layers=2, n_heads=2, context=32, batch_size=4,
            tokens=4 * 32 * 20, log_every=5, eval_windows=4, warmup=2, lr=1e-2, device="cpu",
            probe_windows=0)


@pytest.mark.parametrize("schedule", ["cosine", "constant", "wsd"])
def test_every_schedule_warms_up_to_the_rate(schedule):
    cfg = PretrainConfig.make(**TINY, schedule=schedule)
    rates = [lr_at(cfg, s) for s in range(cfg.steps)]
    assert rates[0] == pytest.approx(cfg.train.lr / 2) and rates[1] == pytest.approx(cfg.train.lr)
    assert min(rates[2:]) >= MIN_LR_SHARE * cfg.train.lr - 1e-12


def test_constant_holds_and_wsd_holds_then_decays_over_its_share():
    constant = PretrainConfig.make(**TINY, schedule="constant")
    assert {lr_at(constant, s) for s in range(2, constant.steps)} == {constant.train.lr}
    wsd = PretrainConfig.make(**TINY, schedule="wsd", decay_share=0.25)  # 20 steps: last 5
    rates = [lr_at(wsd, s) for s in range(wsd.steps)]
    assert rates[2:15] == [wsd.train.lr] * 13
    assert all(a > b for a, b in zip(rates[15:], rates[16:]))  # falls over the last five
    # a constant run stopped early is the run of the shorter budget: its rates do not depend
    # on the budget, where the cosine's do
    longer = PretrainConfig.make(**{**TINY, "tokens": 2 * TINY["tokens"]}, schedule="constant")
    assert [lr_at(longer, s) for s in range(20)] == [lr_at(constant, s) for s in range(20)]
    cos, cos_long = (PretrainConfig.make(**{**TINY, "tokens": t}) for t in
                     (TINY["tokens"], 2 * TINY["tokens"]))
    assert lr_at(cos, 10) != lr_at(cos_long, 10)


@pytest.mark.parametrize("key, value", [("schedule", "linear"), ("precision", "float16"),
                                        ("decay_share", 0.0), ("decay_share", 1.5)])
def test_bad_schedule_or_precision_is_one_sentence(key, value):
    with pytest.raises(ConfigError, match=f"train.{key}="):
        PretrainConfig.make(**TINY, **{key: value})


def test_old_records_without_the_new_settings_read_as_cosine_float32():
    cfg = PretrainConfig.make(**TINY)
    old = cfg.to_dict()
    for key in ("schedule", "decay_share", "precision"):
        old["train"].pop(key)
    assert from_dict(old) == cfg


def test_bfloat16_trains_float32_weights_and_measures_in_float32(tmp_path):
    cfg = PretrainConfig.make(**TINY, precision="bfloat16", schedule="constant")
    model = build(cfg, torch.device("cpu"))
    ids = torch.randint(0, 256, (2, 32))
    with autocast(cfg, torch.device("cpu")):
        logits = model(ids).logits
    assert logits.dtype == torch.bfloat16  # the step's arithmetic
    assert all(p.dtype == torch.float32 for p in model.parameters())
    plain = PretrainConfig.make(**TINY)
    with autocast(plain, torch.device("cpu")):
        assert model(ids).logits.dtype == torch.float32
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "finished"
    curve = read_curve(tmp_path / "run")
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 0.3  # it learned
    state = torch.load(tmp_path / "run" / "model.pt", weights_only=True)["model"]
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())


def test_flops_count_the_step_once_per_token():
    cfg = PretrainConfig.make(**TINY)
    assert flops_per_token(cfg) == pytest.approx(step_flops(cfg) / (4 * 32))
    wider = PretrainConfig.make(**{**TINY, "d_model": 32})
    assert 2 < flops_per_token(wider) / flops_per_token(cfg) < 4  # the matmuls grow as d^2


def test_the_same_seed_gives_the_same_bfloat16_run(tmp_path):
    """bfloat16 autocast keeps a run reproducible: the same settings and seed (and, as here, the
    same thread count) give the same curve, point for point."""
    cfg = PretrainConfig.make(**{**TINY, "tokens": 4 * 32 * 10}, precision="bfloat16",
                              schedule="wsd")
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")
    drop = ("seconds",)
    a, b = ([{k: v for k, v in p.items() if k not in drop} for p in read_curve(tmp_path / r)]
            for r in ("a", "b"))
    assert a == b and len(a) == 3


@pytest.mark.parametrize("rule, args", [("softmax1", {}), ("sink_logit", {"init": 0.7}),
                                        ("kv_bias", {})])
def test_softmax_with_one_more_key_runs_fused_and_equals_its_weights(rule, args):
    """softmax_1, the sink logit and kv_bias train on PyTorch's fused attention over their
    extra key put first: the same logits and the same gradients as the weights' path."""
    from sinklab.pretrain import data
    from sinklab.pretrain.network import LanguageModel, LMShape

    shape = LMShape(vocab_size=data.VOCAB_SIZE, d_model=16, n_layers=2, n_heads=2, context=24,
                    attention=rule, attention_args=args)
    model = LanguageModel(shape)
    model.reset_parameters(torch.Generator().manual_seed(3))
    with torch.no_grad():  # learned keys and logits away from their start, so that they count
        for name, p in model.named_parameters():
            if ".rule." in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    ids = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(5))
    assert model.layers[0].attn.sink_key
    outputs, grads = [], []
    for weights in (False, True):  # the fused path, then the weights' path
        model.zero_grad()
        logits = model(ids, return_weights=weights).logits
        logits.square().mean().backward()
        outputs.append(logits.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    fused = outputs[0]
    assert torch.allclose(fused, outputs[1], atol=1e-5)
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-5), name
    # under bfloat16 autocast the fused path runs too, to bfloat16's precision
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(ids).logits
    assert (low.float() - fused).abs().max() < 0.1
