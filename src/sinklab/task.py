"""The paper's trigger-conditional averaging task, generated as whole batches of tensors.

Each token x_i in R^d has four kinds of coordinate (positions 0-indexed, BOS at 0):

    coordinate 0        BOS flag: 1 only at i = 0, so BOS is exactly e_0
    coordinate 1        trigger flag: 1 only at the trigger position j
    coordinates 2..d-2  content: i.i.d. Uniform(-1, 1) for every non-BOS token, trigger included
    coordinate d-1      bias flag: 1 for ordinary content tokens, 0 for BOS and the trigger

One encoded example with seq_len=4, d_model=4, trigger j=2 (one content coordinate)::

    i=0  [1, 0,  0.00, 0]    BOS                        plain target  [0, 0, 0, 0]
    i=1  [0, 0,  0.30, 1]    content                                  [0, 0, 0, 0]
    i=2  [0, 1, -0.50, 0]    trigger                                  mean(x_1, x_2) =
                                                                      [0, 0.5, -0.10, 0.5]
    i=3  [0, 0,  0.90, 1]    content                                  [0, 0, 0, 0]

Residual targets add x_i to every row: y_i = x_i off the trigger, y_j = x_j + mean(x_1..x_j).
There is no positional encoding; the only position information is BOS and the causal mask.

Beyond the paper (``task.no_trigger_prob``, ``task.max_triggers``) a sequence may have no trigger
(every target row is zero, or x) or several. With several triggers each trigger row j gets the
target a lone trigger at j would get, mean(x_1..x_j): every non-BOS token up to and including j,
earlier triggers included. Such batches carry a boolean (batch, L) mask of trigger rows instead of
one position per sequence; ``sinklab.metrics`` accepts either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sinklab.config import TaskConfig

BOS, TRIGGER, CONTENT_START = 0, 1, 2  # coordinate indices; the bias flag is the last one


@dataclass
class Batch:
    """A batch of sequences: inputs and targets (batch, seq_len, d_model), and the triggers:
    positions (batch,) when every sequence has exactly one, else a boolean (batch, seq_len) mask.
    """

    x: Tensor
    y: Tensor
    trigger: Tensor


def trigger_mask(trigger: Tensor, seq_len: int) -> Tensor:
    """Trigger positions (..., batch) or a boolean mask (..., batch, L) -> the boolean mask."""
    if trigger.dtype == torch.bool:
        return trigger
    return torch.arange(seq_len, device=trigger.device) == trigger[..., None]


def encode(content: Tensor, trigger: Tensor) -> Tensor:
    """Build inputs (batch, L, d) from content (batch, L, d - 3) and the triggers: positions
    (batch,) or a boolean mask (batch, L) of trigger rows.

    The content at position 0 is ignored: BOS carries no content.
    """
    batch, seq_len, n_content = content.shape
    d_model = n_content + 3
    is_trigger = trigger_mask(trigger, seq_len)
    x = torch.empty(batch, seq_len, d_model, dtype=content.dtype, device=content.device)
    x[..., CONTENT_START:d_model - 1] = content
    x[..., TRIGGER] = is_trigger
    x[..., d_model - 1] = ~is_trigger
    x[..., BOS] = 0.0
    x[:, 0] = 0.0  # BOS is exactly e_0
    x[:, 0, BOS] = 1.0
    return x


def targets(x: Tensor, trigger: Tensor, residual: bool) -> Tensor:
    """Targets (batch, L, d): the mean of x_1..x_j at the trigger row j, zero (or x) elsewhere.

    ``trigger`` is (batch,) positions, or a boolean (batch, L) mask for any number of triggers.
    """
    batch, seq_len, _ = x.shape
    if trigger.dtype == torch.bool:
        # running mean of x_1..x_i at every row i >= 1 (row 0 is BOS, never a trigger)
        count = torch.arange(1, seq_len, device=x.device, dtype=x.dtype)[:, None]
        running = torch.zeros_like(x)
        running[:, 1:] = x[:, 1:].cumsum(dim=1) / count
        y = x.clone() if residual else torch.zeros_like(x)
        return y + running * trigger[..., None]
    pos = torch.arange(seq_len, device=x.device)
    # (batch, L) averaging weights: 1/j on positions 1..j, 0 elsewhere
    weights = ((pos > 0) & (pos <= trigger[:, None])).to(x.dtype) / trigger.to(x.dtype)[:, None]
    mean = (weights[..., None] * x).sum(dim=1)  # (batch, d)
    rows = torch.arange(batch, device=x.device)
    y = x.clone() if residual else torch.zeros_like(x)
    y[rows, trigger] += mean
    return y


def sample_batch(
    cfg: TaskConfig,
    batch_size: int,
    generator: torch.Generator,
    *,
    residual: bool,
    trigger: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """Draw a fresh batch from ``generator`` (on the generator's device).

    Training triggers are uniform over ``cfg.train_trigger_min..cfg.train_trigger_max``; pass
    ``trigger`` to fix the position (evaluation). The triggers are drawn before the content, so a
    fixed trigger and a random one consume the generator differently. With a trigger frequency
    other than the paper's (``cfg.single_trigger`` false) and no fixed ``trigger``, the batch's
    triggers are drawn by ``draw_triggers`` and returned as a mask.
    """
    device = generator.device
    if trigger is None and not cfg.single_trigger:
        j = draw_triggers(cfg, (batch_size,), generator)
    elif trigger is None:
        j = torch.randint(cfg.train_trigger_min, cfg.train_trigger_max + 1, (batch_size,),
                          generator=generator, device=device)
    else:
        j = torch.full((batch_size,), trigger, dtype=torch.long, device=device)
    content = torch.rand(batch_size, cfg.seq_len, cfg.d_model - 3, generator=generator,
                         device=device, dtype=dtype) * 2 - 1
    x = encode(content, j)
    return Batch(x=x, y=targets(x, j, residual), trigger=j)


def draw_triggers(cfg: TaskConfig, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """A boolean (*shape, L) mask of trigger rows for ``cfg``'s trigger frequency.

    Each sequence has no trigger with probability ``cfg.no_trigger_prob``, else k triggers with k
    uniform over 1..``cfg.max_triggers``, at k distinct positions drawn uniformly from the
    training range (the k smallest of independent uniform keys, one per allowed position).
    """
    device = generator.device
    lo, hi = cfg.train_trigger_min, cfg.train_trigger_max
    none = torch.rand(shape, generator=generator, device=device) < cfg.no_trigger_prob
    count = torch.randint(1, cfg.max_triggers + 1, shape, generator=generator, device=device)
    count = count.masked_fill(none, 0)
    keys = torch.rand(*shape, hi - lo + 1, generator=generator, device=device)
    rank = keys.argsort(dim=-1).argsort(dim=-1)  # each allowed position's rank among the keys
    mask = torch.zeros(*shape, cfg.seq_len, dtype=torch.bool, device=device)
    mask[..., lo:hi + 1] = rank < count[..., None]
    return mask


class TrainStream:
    """Training batches for an ensemble: member e's batches come from ``generators[e]`` alone.

    Each member's generator is read in blocks of ``BLOCK`` steps (all triggers of the block, then
    all content), so a member's data stream depends only on its own generator, never on the other
    members. Several steps are encoded per call (up to ``ENCODE_SEQUENCES`` sequences), so the
    per-step Python work grows neither with the number of members nor with the block.
    ``next()`` returns x, y (members, batch, L, d) and triggers (members, batch), or trigger
    masks (members, batch, L) for a task with another trigger frequency than the paper's.
    """

    BLOCK = 8  # part of the stream's definition: changing it changes every member's data
    ENCODE_SEQUENCES = 2048  # sequences encoded per call: speed only, the data are the same

    def __init__(self, cfg: TaskConfig, batch_size: int, generators: list[torch.Generator], *,
                 residual: bool, dtype: torch.dtype = torch.float32) -> None:
        self.cfg, self.generators, self.residual = cfg, generators, residual
        n, k, device = len(generators), self.BLOCK, generators[0].device
        if cfg.single_trigger:  # positions (members, steps, batch)
            self._trigger = torch.empty(n, k, batch_size, dtype=torch.long, device=device)
        else:  # masks (members, steps, batch, L)
            self._trigger = torch.empty(n, k, batch_size, cfg.seq_len, dtype=torch.bool,
                                        device=device)
        self._content = torch.empty(n, k, batch_size, cfg.seq_len, cfg.d_model - 3, dtype=dtype,
                                    device=device)
        self._block: list[Batch] = []
        self._next = k  # index of the next step within the block; k means "refill first"

    def _refill(self) -> None:
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
        # Encode several steps at once while that stays small enough to sit in cache.
        chunk = max(1, min(k, self.ENCODE_SEQUENCES // (n * b)))
        self._block = []
        for start in range(0, k, chunk):
            # step-major (steps, members, batch, ...), so each step's tensors are contiguous
            trigger = self._trigger[:, start:start + chunk].transpose(0, 1)
            content = self._content[:, start:start + chunk].transpose(0, 1)
            flat = trigger.flatten(0, 2)
            x = encode(content.flatten(0, 2), flat)
            y = targets(x, flat, self.residual)
            x, y = x.unflatten(0, trigger.shape[:3]), y.unflatten(0, trigger.shape[:3])
            self._block += [Batch(x=x[i], y=y[i], trigger=trigger[i]) for i in range(len(x))]
        self._next = 0

    def next(self) -> Batch:
        if self._next == self.BLOCK:
            self._refill()
        self._next += 1
        return self._block[self._next - 1]
