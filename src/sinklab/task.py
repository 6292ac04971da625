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
    x = torch.empty(batch, seq_len, n_content + 3, dtype=content.dtype, device=content.device)
    x[..., :CONTENT_START] = 0.0  # every row an ordinary content token first
    x[..., -1] = 1.0
    x[..., CONTENT_START:-1] = content
    if trigger.dtype == torch.bool:
        _flag_mask(x, trigger, as_trigger=True)
    else:
        first_row = torch.arange(batch, device=x.device) * seq_len
        _flag_rows(x.view(-1, x.shape[-1]), first_row + trigger, as_trigger=True)
    _set_bos(x)
    return x


def _ordinary_row(d_model: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The flags of an ordinary content token (d,): BOS and trigger flags 0, bias flag 1."""
    row = torch.zeros(d_model, dtype=dtype, device=device)
    row[-1] = 1.0
    return row


def _flag_rows(rows: Tensor, at: Tensor, *, as_trigger: bool) -> None:
    """Flag the rows ``at`` of rows (R, d), tokens one after another, as triggers (trigger flag
    1, bias flag 0) or, with ``as_trigger`` false, as ordinary tokens (0, 1)."""
    flag, bias = (1.0, 0.0) if as_trigger else (0.0, 1.0)
    rows[:, TRIGGER].index_fill_(0, at, flag)
    rows[:, -1].index_fill_(0, at, bias)


def _flag_mask(x: Tensor, mask: Tensor, *, as_trigger: bool) -> None:
    """``_flag_rows`` for the rows of x (..., L, d) that a boolean mask (..., L) selects."""
    flag, bias = (1.0, 0.0) if as_trigger else (0.0, 1.0)
    x[..., TRIGGER].masked_fill_(mask, flag)
    x[..., -1].masked_fill_(mask, bias)


def _set_bos(x: Tensor) -> None:
    """Make row 0 of every sequence in x (..., L, d) exactly e_0, whatever it held."""
    x[..., 0, :].zero_()
    x[..., 0, BOS].fill_(1.0)


def _mean_weights(seq_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Averaging weights (L, L): row j holds 1/j on positions 1..j and 0 elsewhere."""
    pos = torch.arange(seq_len, device=device)
    j = pos[:, None]
    return ((pos > 0) & (pos <= j)).to(dtype) / j.to(dtype)


def targets(x: Tensor, trigger: Tensor, residual: bool) -> Tensor:
    """Targets (batch, L, d): the mean of x_1..x_j at the trigger row j, zero (or x) elsewhere.

    ``trigger`` is (batch,) positions, or a boolean (batch, L) mask for any number of triggers.
    """
    y = x.clone() if residual else torch.zeros_like(x)
    if trigger.dtype == torch.bool:
        _add_running_means(y, x, trigger)
    else:
        rows = torch.arange(x.shape[0], device=x.device)
        y[rows, trigger] += _trigger_means(x, trigger)
    return y


# The two helpers below form every number with the same operations, in the same order, as the
# task's first version did (a frozen copy in tests/engine/test_task.py checks it), so the targets
# keep every bit whatever the layout they are written to.


def _trigger_means(x: Tensor, trigger: Tensor, *, weights: Tensor | None = None,
                   out: Tensor | None = None) -> Tensor:
    """The mean of x_1..x_j (..., d) for sequences x (..., L, d) with their triggers at j (...).

    ``weights`` is ``_mean_weights`` for x; ``out`` an optional contiguous tensor shaped like x
    for the products.
    """
    if weights is None:
        weights = _mean_weights(x.shape[-2], x.dtype, x.device)
    w = weights[trigger][..., None]  # (..., L, 1): 1/j on positions 1..j, 0 elsewhere
    # The sum over L of all L products, zeros included: torch's reduction order for a
    # (..., L, d) tensor depends on L, d and the CPU's vector width, so it is left to torch.
    products = w * x if out is None else torch.mul(w, x, out=out)
    return products.sum(dim=-2)


def _add_running_means(y: Tensor, x: Tensor, mask: Tensor, *, out: Tensor | None = None) -> None:
    """Add to y (..., L, d), at every row i that mask (..., L) selects, the mean of x_1..x_i.

    ``out`` is an optional tensor shaped like x for the running means.
    """
    count = torch.arange(1, x.shape[-2], device=x.device, dtype=x.dtype)[:, None]
    running = torch.empty_like(x) if out is None else out
    running[..., 0, :] = 0.0  # row 0 is BOS, never a trigger
    torch.cumsum(x[..., 1:, :], dim=-2, out=running[..., 1:, :])
    running[..., 1:, :].div_(count)
    y.add_(running.mul_(mask[..., None]))


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
    members. The content is drawn straight into the block's inputs, and a group of members (up
    to ``ENCODE_SEQUENCES`` sequences over the whole block) is encoded per call while it is still
    in cache, so the per-step Python work grows neither with the number of members nor with the
    block. ``next()`` returns x, y (members, batch, L, d) and triggers (members, batch), or
    trigger masks (members, batch, L) for a task with another trigger frequency than the
    paper's.

    Every block is drawn into the same tensors: a batch's x, y and trigger are overwritten
    ``BLOCK`` calls of ``next()`` later. Clone what must outlive that.
    """

    BLOCK = 8  # part of the stream's definition: changing it changes every member's data
    ENCODE_SEQUENCES = 2048  # sequences encoded per call: speed only, the data are the same

    def __init__(self, cfg: TaskConfig, batch_size: int, generators: list[torch.Generator], *,
                 residual: bool, dtype: torch.dtype = torch.float32) -> None:
        self.cfg, self.generators, self.residual = cfg, generators, residual
        n, k, device = len(generators), self.BLOCK, generators[0].device
        self._batch_size, seq_len, d_model = batch_size, cfg.seq_len, cfg.d_model
        # Step-major (steps, members, batch, ...), so each step's tensors are contiguous. The
        # inputs start as ordinary tokens and the targets as zeros; each refill then undoes the
        # last block's triggers before it draws the next.
        shape = (k, n, batch_size, seq_len, d_model)
        self._x = _ordinary_row(d_model, dtype, device).expand(shape).contiguous()
        self._y = torch.zeros(shape, dtype=dtype, device=device)
        if cfg.single_trigger:  # positions, at an ordinary row to start with
            self._trigger = torch.full(shape[:3], cfg.train_trigger_min, dtype=torch.long,
                                       device=device)
        else:  # masks
            self._trigger = torch.zeros(shape[:4], dtype=torch.bool, device=device)
        # the index of each sequence's row 0 among the rows of x.view(-1, d)
        self._first_row = torch.arange(0, self._x.numel() // d_model, seq_len,
                                       device=device).view(shape[:3])
        self._group = max(1, min(n, self.ENCODE_SEQUENCES // (k * batch_size)))  # members
        self._scratch = torch.empty(k * self._group * batch_size * seq_len * d_model, dtype=dtype,
                                    device=device)
        self._weights = _mean_weights(seq_len, dtype, device)
        self._block = [Batch(x=self._x[i], y=self._y[i], trigger=self._trigger[i])
                       for i in range(k)]
        self._next = k  # index of the next step within the block; k means "refill first"

    def _refill(self) -> None:
        cfg, n, k, b = self.cfg, len(self.generators), self.BLOCK, self._batch_size
        x_rows, y_rows = self._x.view(-1, cfg.d_model), self._y.view(-1, cfg.d_model)
        for first in range(0, n, self._group):
            group = slice(first, min(first + self._group, n))
            x, y, trigger = self._x[:, group], self._y[:, group], self._trigger[:, group]
            # The last block's trigger rows become ordinary tokens with zero targets again.
            if cfg.single_trigger:
                at = (self._first_row[:, group] + trigger).flatten()
                _flag_rows(x_rows, at, as_trigger=False)
                if not self.residual:
                    y_rows.index_fill_(0, at, 0.0)
            else:
                _flag_mask(x, trigger, as_trigger=False)
                if not self.residual:
                    y.zero_()
            for e in range(group.start, group.stop):
                g = self.generators[e]
                if cfg.single_trigger:
                    self._trigger[:, e] = torch.randint(
                        cfg.train_trigger_min, cfg.train_trigger_max + 1, (k, b), generator=g,
                        device=g.device)
                else:
                    self._trigger[:, e] = draw_triggers(cfg, (k, b), g)
                _draw_content(self._x[:, e, ..., CONTENT_START:-1], g)
            if cfg.single_trigger:
                at = (self._first_row[:, group] + trigger).flatten()
                _flag_rows(x_rows, at, as_trigger=True)
            else:
                _flag_mask(x, trigger, as_trigger=True)
            _set_bos(x)  # the content was drawn over row 0 too
            if self.residual:
                y.copy_(x)
            scratch = self._scratch[:x.numel()].view(x.shape)
            if cfg.single_trigger:
                mean = _trigger_means(x, trigger, weights=self._weights, out=scratch)
                y_rows.index_add_(0, at, mean.view(-1, cfg.d_model))
            else:
                _add_running_means(y, x, trigger, out=scratch)
        self._next = 0

    def next(self) -> Batch:
        if self._next == self.BLOCK:
            self._refill()
        self._next += 1
        return self._block[self._next - 1]


def _draw_content(view: Tensor, generator: torch.Generator) -> None:
    """Fill one member's content (steps, batch, L, d - 3), a view into the block's inputs, with
    Uniform(-1, 1) numbers: those of one ``torch.rand`` of that shape, times 2, minus 1.

    On the CPU in float32 and float64, ``uniform_(-1, 1)`` gives exactly these bits (2u - 1 is
    exact for every u it can draw) and writes them in place in the same order; elsewhere (other
    devices, half precision) the numbers are drawn contiguously by ``torch.rand`` and copied.
    """
    if view.device.type == "cpu" and view.dtype in (torch.float32, torch.float64):
        view.uniform_(-1.0, 1.0, generator=generator)
        return
    content = torch.rand(view.shape, generator=generator, device=view.device, dtype=view.dtype)
    view.copy_(content.mul_(2).sub_(1))
