"""A reference-style training loop, written from the description of the paper's reference code.

It is the baseline of ``train_speed.py``: the way such experiments are usually coded, not
sinklab's way. One sequence is generated at a time in Python, a DataLoader collates 128 of them
per step, one model is trained, and the loss and the L-infinity error are read to the host with
``.item()`` every step. The model is the paper's: attention only, full-width heads, no biases, no
scaling, N(0, 0.02^2) init, softmax or ReLU / max(i, 1) attention, residual for several layers.

    python benchmarks/reference_loop.py --layers 1 --heads 1 --steps 300
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset


class TriggerSequences(IterableDataset):
    """An endless stream of single sequences, each built in Python."""

    def __init__(self, seq_len: int, d_model: int, residual: bool, seed: int) -> None:
        self.seq_len, self.d_model, self.residual = seq_len, d_model, residual
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def one(self) -> tuple[torch.Tensor, torch.Tensor]:
        L, d = self.seq_len, self.d_model
        j = self.rng.randint(2, L - 1)
        x = torch.zeros(L, d)
        x[0, 0] = 1.0
        x[1:, 2:d - 1] = torch.rand(L - 1, d - 3, generator=self.gen) * 2 - 1
        x[1:, d - 1] = 1.0
        x[j, 1] = 1.0
        x[j, d - 1] = 0.0
        y = x.clone() if self.residual else torch.zeros(L, d)
        y[j] += x[1:j + 1].mean(dim=0)
        return x, y

    def __iter__(self):
        while True:
            yield self.one()


class Head(nn.Module):
    def __init__(self, d: int, relu: bool) -> None:
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        scores = self.q(x) @ self.k(x).transpose(1, 2)
        mask = torch.tril(torch.ones(L, L, dtype=torch.bool))
        if self.relu:
            divisor = torch.arange(L).clamp(min=1).float()[:, None]
            weights = torch.relu(scores).masked_fill(~mask, 0.0) / divisor
        else:
            weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return weights @ self.v(x)


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, relu: bool) -> None:
        super().__init__()
        self.heads = nn.ModuleList(Head(d, relu) for _ in range(heads))
        self.o = nn.Linear(heads * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.cat([h(x) for h in self.heads], dim=-1))


class Model(nn.Module):
    def __init__(self, d: int, layers: int, heads: int, relu: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, heads, relu) for _ in range(layers))
        self.residual = layers > 1
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x) if self.residual else layer(x)
        return x


def train(layers: int, heads: int, steps: int, rule: str = "softmax", seed: int = 0,
          seq_len: int = 16, d_model: int = 16, batch: int = 128) -> dict[str, float]:
    """Run ``steps`` reference-style steps; return steps/s and the last loss."""
    torch.manual_seed(seed)
    model = Model(d_model, layers, heads, rule == "relu")
    lr = 1e-3 if layers == heads == 1 else 1e-4
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.95))
    data = DataLoader(TriggerSequences(seq_len, d_model, layers > 1, seed), batch_size=batch)
    start = time.perf_counter()
    loss_value = float("nan")
    for step, (x, y) in enumerate(data):
        if step == steps:
            break
        err = model(x) - y
        loss = err.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = loss.item()
        if err.abs().max().item() < 5e-3:
            break
    elapsed = time.perf_counter() - start
    return {"steps_per_s": steps / elapsed, "loss": loss_value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rule", default="softmax", choices=("softmax", "relu"))
    args = parser.parse_args()
    result = train(args.layers, args.heads, args.steps, args.rule)
    print(f"reference-style loop {args.layers}x{args.heads} {args.rule}: "
          f"{result['steps_per_s']:.1f} steps/s (loss {result['loss']:.3e})")


if __name__ == "__main__":
    main()
