"""The trigger-conditional task: exact encoding and targets (SPEC section 2)."""

from __future__ import annotations

import pytest
import torch

from sinklab.config import TaskConfig
from sinklab.task import encode, sample_batch, targets


def batch(cfg=None, n=64, seed=0, residual=False, trigger=None):
    cfg = cfg or TaskConfig()
    return sample_batch(cfg, n, torch.Generator().manual_seed(seed), residual=residual,
                        trigger=trigger)


def test_bos_is_e0():
    b = batch()
    e0 = torch.zeros(16)
    e0[0] = 1
    assert torch.equal(b.x[:, 0], e0.expand(64, 16))
    assert torch.all(b.x[:, 1:, 0] == 0)


def test_trigger_and_bias_flags():
    b = batch(n=256)
    rows = torch.arange(256)
    assert torch.all(b.x[rows, b.trigger, 1] == 1)
    assert torch.all(b.x[..., 1].sum(dim=1) == 1)  # exactly one trigger per sequence
    bias = b.x[..., -1]
    assert torch.all(bias[:, 0] == 0)  # BOS
    assert torch.all(bias[rows, b.trigger] == 0)  # trigger
    assert torch.all(bias.sum(dim=1) == 16 - 2)  # every other token


def test_content_is_uniform_and_absent_at_bos():
    b = batch(n=512)
    content = b.x[:, :, 2:-1]
    assert torch.all(content[:, 0] == 0)
    assert content[:, 1:].min() >= -1 and content[:, 1:].max() <= 1
    assert abs(content[:, 1:].mean().item()) < 0.02
    assert content[:, 1:].std().item() == pytest.approx((1 / 3) ** 0.5, abs=0.02)
    rows = torch.arange(512)
    assert torch.any(content[rows, b.trigger] != 0)  # the trigger carries content too


def test_training_triggers_cover_2_to_L_minus_1():
    b = batch(n=4000)
    assert set(b.trigger.tolist()) == set(range(2, 16))


def test_trigger_range_option_and_fixed_trigger():
    cfg = TaskConfig(train_trigger_min=5, train_trigger_max=6)
    assert set(batch(cfg, n=500).trigger.tolist()) == {5, 6}
    assert set(batch(trigger=7).trigger.tolist()) == {7}


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_targets_match_the_definition(residual):
    b = batch(n=32, residual=residual)
    for i in range(32):
        j = int(b.trigger[i])
        expected = b.x[i].clone() if residual else torch.zeros_like(b.x[i])
        expected[j] += b.x[i, 1:j + 1].mean(dim=0)
        torch.testing.assert_close(b.y[i], expected)


def test_worked_example_from_the_docstring():
    content = torch.tensor([[[0.0], [0.3], [-0.5], [0.9]]])
    x = encode(content, torch.tensor([2]))
    expected = torch.tensor([[[1, 0, 0, 0], [0, 0, 0.3, 1], [0, 1, -0.5, 0], [0, 0, 0.9, 1.0]]])
    torch.testing.assert_close(x, expected)
    y = targets(x, torch.tensor([2]), residual=False)
    torch.testing.assert_close(y[0, 2], torch.tensor([0, 0.5, -0.1, 0.5]))
    assert torch.all(y[0, [0, 1, 3]] == 0)


def test_same_generator_seed_same_batch_and_different_seed_differs():
    a, b, c = batch(seed=3), batch(seed=3), batch(seed=4)
    assert torch.equal(a.x, b.x) and torch.equal(a.trigger, b.trigger)
    assert not torch.equal(a.x, c.x)


def test_minimum_sizes():
    cfg = TaskConfig(seq_len=4, d_model=4, eval_trigger=3)
    b = batch(cfg, n=8)
    assert b.x.shape == (8, 4, 4)
    assert set(b.trigger.tolist()) <= {2, 3}


@pytest.mark.parametrize("encode_sequences", [2048, 40], ids=["whole-block", "small-chunks"])
def test_train_stream_member_data_is_its_own_generators_alone(monkeypatch, encode_sequences):
    # With 40, the ensemble encodes one step per call and the lone member two: the data must
    # not depend on how many steps are encoded together.
    from sinklab.task import TrainStream

    monkeypatch.setattr(TrainStream, "ENCODE_SEQUENCES", encode_sequences)
    cfg = TaskConfig()

    def stream(seeds):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        return TrainStream(cfg, 16, gens, residual=True)

    together, alone = stream([1, 2, 3]), stream([2])
    for _ in range(2 * TrainStream.BLOCK + 3):  # across block refills
        a, b = together.next(), alone.next()
        assert a.x.shape == (3, 16, 16, 16) and a.trigger.shape == (3, 16)
        assert torch.equal(a.x[1], b.x[0]) and torch.equal(a.y[1], b.y[0])
        assert torch.equal(a.trigger[1], b.trigger[0])
        assert not torch.equal(a.x[0], a.x[1])


def test_train_stream_batches_follow_the_task():
    from sinklab.task import TrainStream

    cfg = TaskConfig(train_trigger_min=3, train_trigger_max=9)
    s = TrainStream(cfg, 64, [torch.Generator().manual_seed(0)] * 1, residual=False)
    b = s.next()
    x, trig = b.x[0], b.trigger[0]
    assert set(trig.tolist()) <= set(range(3, 10))
    torch.testing.assert_close(x, encode(x[:, :, 2:-1], trig))  # flags match the triggers
    torch.testing.assert_close(b.y[0], targets(x, trig, residual=False))
    assert x[:, 1:, 2:-1].abs().max() <= 1 and torch.all(x[:, 0] == torch.eye(16)[0])


# ------------------------------------------------------------- trigger frequency (zoo extensions)


def test_paper_task_is_single_trigger_and_keeps_positions():
    assert TaskConfig().single_trigger
    assert batch().trigger.dtype == torch.long


def test_trigger_frequency_counts_and_positions():
    cfg = TaskConfig(no_trigger_prob=0.25, max_triggers=3, train_trigger_min=4,
                     train_trigger_max=12)
    assert not cfg.single_trigger
    b = batch(cfg, n=4000)
    assert b.trigger.shape == (4000, 16) and b.trigger.dtype == torch.bool
    count = b.trigger.sum(-1)
    assert abs((count == 0).float().mean().item() - 0.25) < 0.03
    for k in (1, 2, 3):  # the rest spread evenly over 1..max_triggers
        assert abs((count == k).float().mean().item() - 0.75 / 3) < 0.03
    assert count.max() == 3
    assert not b.trigger[:, :4].any() and not b.trigger[:, 13:].any()
    used = b.trigger.float().mean(0)[4:13]
    assert used.min() > 0.6 * used.max()  # every allowed position is drawn, roughly evenly


def test_several_triggers_each_average_their_own_prefix():
    cfg = TaskConfig(seq_len=8, d_model=5, eval_trigger=7, max_triggers=6)
    b = batch(cfg, n=200, seed=3, residual=True)
    x = b.x
    for n in range(200):
        for i in range(8):
            want = x[n, i].clone()
            if b.trigger[n, i]:
                want += x[n, 1:i + 1].mean(0)  # every non-BOS token up to i, triggers included
                assert x[n, i, 1] == 1 and x[n, i, -1] == 0
            else:
                assert x[n, i, 1] == 0
            torch.testing.assert_close(b.y[n, i], want)
    assert (b.trigger.sum(-1) >= 2).any()


def test_no_trigger_sequences_have_zero_targets():
    cfg = TaskConfig(no_trigger_prob=0.5)
    b = batch(cfg, n=300)
    empty = b.trigger.sum(-1) == 0
    assert empty.any()
    assert torch.all(b.y[empty] == 0) and torch.all(b.x[empty][..., 1] == 0)


def test_mask_form_equals_position_form_on_one_trigger():
    b = batch(n=50, residual=True)
    mask = torch.arange(16) == b.trigger[:, None]
    torch.testing.assert_close(targets(b.x, mask, residual=True), b.y)
    torch.testing.assert_close(encode(b.x[..., 2:-1], mask), b.x)


def test_train_stream_with_trigger_frequency_keeps_members_apart():
    from sinklab.task import TrainStream

    cfg = TaskConfig(no_trigger_prob=0.3, max_triggers=2)
    gens = [torch.Generator().manual_seed(s) for s in (5, 6)]
    together = TrainStream(cfg, 8, gens, residual=False)
    alone = TrainStream(cfg, 8, [torch.Generator().manual_seed(6)], residual=False)
    for _ in range(TrainStream.BLOCK + 2):
        a, b = together.next(), alone.next()
        assert a.trigger.shape == (2, 8, 16)
        assert torch.equal(a.trigger[1], b.trigger[0]) and torch.equal(a.y[1], b.y[0])
        torch.testing.assert_close(a.y[0], targets(a.x[0], a.trigger[0], residual=False))


@pytest.mark.parametrize("key, value, allowed", [
    ("no_trigger_prob", 1.0, "[0, 1)"), ("no_trigger_prob", -0.1, "[0, 1)"),
    ("max_triggers", 0, "1..14"), ("max_triggers", 15, "1..14"), ("max_triggers", 2.5, "1..14"),
])
def test_trigger_frequency_values_are_checked(key, value, allowed):
    import re

    from sinklab.config import ConfigError

    with pytest.raises(ConfigError, match=f"task.{key}=.*{re.escape(allowed)}"):
        TaskConfig(**{key: value})
