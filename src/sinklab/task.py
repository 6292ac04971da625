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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sinklab.config import TaskConfig

BOS, TRIGGER, CONTENT_START = 0, 1, 2  # coordinate indices; the bias flag is the last one


@dataclass
class Batch:
    """A batch of sequences: inputs and targets (batch, seq_len, d_model), triggers (batch,)."""

    x: Tensor
    y: Tensor
    trigger: Tensor


def encode(content: Tensor, trigger: Tensor) -> Tensor:
    """Build inputs (batch, L, d) from content (batch, L, d - 3) and trigger positions (batch,).

    The content at position 0 is ignored: BOS carries no content.
    """
    batch, seq_len, n_content = content.shape
    d_model = n_content + 3
    pos = torch.arange(seq_len, device=content.device)
    is_trigger = pos[None, :] == trigger[:, None]  # (batch, L)
    is_bos = (pos == 0).expand(batch, seq_len)
    x = torch.zeros(batch, seq_len, d_model, dtype=content.dtype, device=content.device)
    x[:, 1:, CONTENT_START:d_model - 1] = content[:, 1:]
    x[..., BOS] = is_bos.to(content.dtype)
    x[..., TRIGGER] = is_trigger.to(content.dtype)
    x[..., d_model - 1] = (~is_bos & ~is_trigger).to(content.dtype)
    return x


def targets(x: Tensor, trigger: Tensor, residual: bool) -> Tensor:
    """Targets (batch, L, d): the mean of x_1..x_j at the trigger row j, zero (or x) elsewhere."""
    batch, seq_len, _ = x.shape
    prefix = x[:, 1:].cumsum(dim=1)  # prefix[:, i - 1] = x_1 + ... + x_i
    rows = torch.arange(batch, device=x.device)
    mean = prefix[rows, trigger - 1] / trigger.to(x.dtype)[:, None]  # (batch, d)
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
    fixed trigger and a random one consume the generator differently.
    """
    device = generator.device
    if trigger is None:
        j = torch.randint(cfg.train_trigger_min, cfg.train_trigger_max + 1, (batch_size,),
                          generator=generator, device=device)
    else:
        j = torch.full((batch_size,), trigger, dtype=torch.long, device=device)
    content = torch.rand(batch_size, cfg.seq_len, cfg.d_model - 3, generator=generator,
                         device=device, dtype=dtype) * 2 - 1
    x = encode(content, j)
    return Batch(x=x, y=targets(x, j, residual), trigger=j)


class TrainStream:
    """Training batches for an ensemble: member e's batches come from ``generators[e]`` alone.

    Each member's generator is read in blocks of ``BLOCK`` steps (all triggers of the block, then
    all content), so a member's data stream depends only on its own generator, never on the other
    members, and the per-step Python work does not grow with the number of members.
    ``next()`` returns x, y (members, batch, L, d) and triggers (members, batch).
    """

    BLOCK = 8  # part of the stream's definition: changing it changes every member's data

    def __init__(self, cfg: TaskConfig, batch_size: int, generators: list[torch.Generator], *,
                 residual: bool, dtype: torch.dtype = torch.float32) -> None:
        self.cfg, self.generators, self.residual = cfg, generators, residual
        n, k, device = len(generators), self.BLOCK, generators[0].device
        self._trigger = torch.empty(n, k, batch_size, dtype=torch.long, device=device)
        self._content = torch.empty(n, k, batch_size, cfg.seq_len, cfg.d_model - 3, dtype=dtype,
                                    device=device)
        self._next = k  # index of the next step within the block; k means "refill first"

    def _refill(self) -> None:
        lo, hi = self.cfg.train_trigger_min, self.cfg.train_trigger_max
        for e, g in enumerate(self.generators):
            torch.randint(lo, hi + 1, self._trigger.shape[1:], generator=g, out=self._trigger[e])
            torch.rand(self._content.shape[1:], generator=g, out=self._content[e])
        self._next = 0

    def next(self) -> Batch:
        if self._next == self.BLOCK:
            self._refill()
        trigger = self._trigger[:, self._next]  # (E, B)
        content = self._content[:, self._next] * 2 - 1  # (E, B, L, d - 3)
        self._next += 1
        n, b = trigger.shape
        x = encode(content.flatten(0, 1), trigger.flatten())
        y = targets(x, trigger.flatten(), self.residual)
        return Batch(x=x.unflatten(0, (n, b)), y=y.unflatten(0, (n, b)), trigger=trigger)
