"""The trigger-conditional task: exact encoding and targets (SPEC section 2)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinklab.config import TaskConfig
from sinklab.task import Batch, TrainStream, draw_triggers, encode, sample_batch, targets


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
    # With 40, each member is encoded on its own; with 2048, the three together: the data must
    # not depend on how many members are encoded together.
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

    from sinklab.errors import ConfigError

    with pytest.raises(ConfigError, match=f"task.{key}=.*{re.escape(allowed)}"):
        TaskConfig(**{key: value})


# ------------------------------------------- the stream against its pre-optimisation reference
#
# A frozen copy of encode, targets and TrainStream as they were before the speed-ups of the
# stream (commit ad897fb). The data define every training run, so the optimised code must give
# exactly these bits: every x, y and trigger tensor is compared with torch.equal.
# Do not edit the reference to make a test pass; it is the definition the fast code must meet.


def _ref_trigger_mask(trigger, seq_len):
    if trigger.dtype == torch.bool:
        return trigger
    return torch.arange(seq_len, device=trigger.device) == trigger[..., None]


def _ref_encode(content, trigger):
    batch, seq_len, n_content = content.shape
    d_model = n_content + 3
    is_trigger = _ref_trigger_mask(trigger, seq_len)
    x = torch.empty(batch, seq_len, d_model, dtype=content.dtype, device=content.device)
    x[..., 2:d_model - 1] = content
    x[..., 1] = is_trigger
    x[..., d_model - 1] = ~is_trigger
    x[..., 0] = 0.0
    x[:, 0] = 0.0
    x[:, 0, 0] = 1.0
    return x


def _ref_targets(x, trigger, residual):
    batch, seq_len, _ = x.shape
    if trigger.dtype == torch.bool:
        count = torch.arange(1, seq_len, device=x.device, dtype=x.dtype)[:, None]
        running = torch.zeros_like(x)
        running[:, 1:] = x[:, 1:].cumsum(dim=1) / count
        y = x.clone() if residual else torch.zeros_like(x)
        return y + running * trigger[..., None]
    pos = torch.arange(seq_len, device=x.device)
    weights = ((pos > 0) & (pos <= trigger[:, None])).to(x.dtype) / trigger.to(x.dtype)[:, None]
    mean = (weights[..., None] * x).sum(dim=1)
    rows = torch.arange(batch, device=x.device)
    y = x.clone() if residual else torch.zeros_like(x)
    y[rows, trigger] += mean
    return y


class _RefTrainStream:
    BLOCK = 8
    ENCODE_SEQUENCES = 2048

    def __init__(self, cfg, batch_size, generators, *, residual, dtype=torch.float32):
        self.cfg, self.generators, self.residual = cfg, generators, residual
        n, k, device = len(generators), self.BLOCK, generators[0].device
        if cfg.single_trigger:
            self._trigger = torch.empty(n, k, batch_size, dtype=torch.long, device=device)
        else:
            self._trigger = torch.empty(n, k, batch_size, cfg.seq_len, dtype=torch.bool,
                                        device=device)
        self._content = torch.empty(n, k, batch_size, cfg.seq_len, cfg.d_model - 3, dtype=dtype,
                                    device=device)
        self._block = []
        self._next = k

    def _refill(self):
        lo, hi = self.cfg.train_trigger_min, self.cfg.train_trigger_max
        for e, g in enumerate(self.generators):
            if self.cfg.single_trigger:
                torch.randint(lo, hi + 1, self._trigger.shape[1:], generator=g,
                              out=self._trigger[e])
            else:
                self._trigger[e] = draw_triggers(self.cfg, self._trigger.shape[1:3], g)
            torch.rand(self._content.shape[1:], generator=g, out=self._content[e])
            self._content[e].mul_(2).sub_(1)
        n, k, b = self._trigger.shape[:3]
        chunk = max(1, min(k, self.ENCODE_SEQUENCES // (n * b)))
        self._block = []
        for start in range(0, k, chunk):
            trigger = self._trigger[:, start:start + chunk].transpose(0, 1)
            content = self._content[:, start:start + chunk].transpose(0, 1)
            flat = trigger.flatten(0, 2)
            x = _ref_encode(content.flatten(0, 2), flat)
            y = _ref_targets(x, flat, self.residual)
            x, y = x.unflatten(0, trigger.shape[:3]), y.unflatten(0, trigger.shape[:3])
            self._block += [Batch(x=x[i], y=y[i], trigger=trigger[i]) for i in range(len(x))]
        self._next = 0

    def next(self):
        if self._next == self.BLOCK:
            self._refill()
        self._next += 1
        return self._block[self._next - 1]


def assert_streams_equal(cfg, batch_size, seeds, residual, steps, dtype=torch.float32):
    def gens():
        return [torch.Generator().manual_seed(s) for s in seeds]

    new = TrainStream(cfg, batch_size, gens(), residual=residual, dtype=dtype)
    ref = _RefTrainStream(cfg, batch_size, gens(), residual=residual, dtype=dtype)
    for step in range(steps):
        a, b = new.next(), ref.next()  # compared at once: the reference reuses its trigger buffer
        for name in ("x", "y", "trigger"):
            got, want = getattr(a, name), getattr(b, name)
            assert got.dtype == want.dtype and got.shape == want.shape, (step, name)
            assert torch.equal(got, want), f"step {step}: {name} differs from the reference"


TRIGGER_MODES = {"single": {}, "multi": {"no_trigger_prob": 0.3, "max_triggers": 3},
                 "no-trigger-only-some": {"no_trigger_prob": 0.5}}


@pytest.mark.parametrize("members", [1, 32], ids=["1-member", "32-members"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_train_stream_equals_the_reference_at_paper_defaults(members, residual):
    assert_streams_equal(TaskConfig(), 128, range(members), residual,
                         steps=TrainStream.BLOCK + 1)


@pytest.mark.parametrize("mode", list(TRIGGER_MODES), ids=list(TRIGGER_MODES))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("encode_sequences", [2048, 40, 1], ids=["whole-block", "chunks", "steps"])
def test_train_stream_equals_the_reference_across_chunks(monkeypatch, mode, residual,
                                                         encode_sequences):
    monkeypatch.setattr(TrainStream, "ENCODE_SEQUENCES", encode_sequences)
    monkeypatch.setattr(_RefTrainStream, "ENCODE_SEQUENCES", 2048)
    cfg = TaskConfig(**TRIGGER_MODES[mode])
    assert_streams_equal(cfg, 16, [3, 1, 4], residual, steps=2 * TrainStream.BLOCK + 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["float64", "float16"])
def test_train_stream_equals_the_reference_in_other_dtypes(dtype):
    assert_streams_equal(TaskConfig(), 8, [0, 1], True, steps=TrainStream.BLOCK + 2,
                         dtype=dtype)


def test_train_stream_may_share_one_generator_between_members():
    # The members then read it in turn, as the reference does.
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    new = TrainStream(TaskConfig(), 4, [g1, g1], residual=False)
    ref = _RefTrainStream(TaskConfig(), 4, [g2, g2], residual=False)
    for _ in range(TrainStream.BLOCK + 1):
        a, b = new.next(), ref.next()
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        assert torch.equal(a.trigger, b.trigger)


@st.composite
def stream_cases(draw):
    seq_len = draw(st.integers(4, 24))
    lo = draw(st.integers(2, seq_len - 1))
    hi = draw(st.integers(lo, seq_len - 1))
    task = {"seq_len": seq_len, "d_model": draw(st.sampled_from([4, 5, 8, 13, 16, 17, 32, 70])),
            "train_trigger_min": lo, "train_trigger_max": hi, "eval_trigger": hi}
    if draw(st.booleans()):  # another trigger frequency than the paper's: masks
        task["no_trigger_prob"] = draw(st.sampled_from([0.0, 0.2, 0.9]))
        task["max_triggers"] = draw(st.integers(1, hi - lo + 1))
    members = draw(st.integers(1, 5))
    return (TaskConfig(**task), draw(st.integers(1, 9)),
            draw(st.lists(st.integers(0, 2**31), min_size=members, max_size=members)),
            draw(st.booleans()), draw(st.sampled_from([2048, 64, 7, 1])))


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=stream_cases())
def test_train_stream_equals_the_reference_on_any_task(monkeypatch, case):
    cfg, batch_size, seeds, residual, encode_sequences = case
    monkeypatch.setattr(TrainStream, "ENCODE_SEQUENCES", encode_sequences)
    assert_streams_equal(cfg, batch_size, seeds, residual, steps=2 * TrainStream.BLOCK + 1)


@settings(max_examples=60, deadline=None, database=None)
@given(case=stream_cases(), seed=st.integers(0, 2**31), fixed=st.booleans())
def test_encode_and_targets_equal_the_reference(case, seed, fixed):
    # Positions and masks, residual and plain, drawn and fixed triggers, through sample_batch.
    cfg, batch_size, _, residual, _ = case
    g = torch.Generator().manual_seed(seed)
    b = sample_batch(cfg, batch_size, g, residual=residual,
                     trigger=cfg.eval_trigger if fixed else None)
    content = b.x[..., 2:-1].clone()
    content[:, 0] = torch.rand(content[:, 0].shape, generator=g)  # BOS content is ignored
    assert torch.equal(encode(content, b.trigger), _ref_encode(content, b.trigger))
    assert torch.equal(b.x, _ref_encode(content, b.trigger))
    for res in (False, True):
        assert torch.equal(targets(b.x, b.trigger, res), _ref_targets(b.x, b.trigger, res))
    mask = _ref_trigger_mask(b.trigger, cfg.seq_len)
    assert torch.equal(encode(content, mask), _ref_encode(content, mask))
    assert torch.equal(targets(b.x, mask, residual), _ref_targets(b.x, mask, residual))
