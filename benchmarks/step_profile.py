"""Where a training step's time goes: data, forward, loss and stop check, backward, Adam.

    python benchmarks/step_profile.py                 # 1x1, 2x2, 4x4 single models, 1x1 x 32
    python benchmarks/step_profile.py --ops 12        # also the 12 costliest operators

It times the same pieces ``sinklab.train`` runs, step by step, on the paper's configurations,
with one thread (as each ``sinklab reproduce`` worker uses) unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import time

import torch

from sinklab.config import build_run_config
from sinklab.task import TrainStream
from sinklab.train import MemberAdam, build_ensemble

PARTS = ("data", "forward", "loss+stop", "backward", "adam")


def profile(layers: int, heads: int, members: int, steps: int, ops: int) -> None:
    cfgs = [build_run_config({"model": {"n_layers": layers, "n_heads": heads},
                              "train": {"seed": s}}) for s in range(members)]
    cfg = cfgs[0]
    model = build_ensemble(cfgs, torch.device("cpu"))
    stream = TrainStream(cfg.task, cfg.train.batch_size,
                         [torch.Generator().manual_seed(s) for s in range(members)],
                         residual=cfg.residual)
    opt = MemberAdam(list(model.parameters()), torch.full((members,), cfg.train.lr),
                     (0.9, 0.95), 1e-8)

    def step() -> list[float]:
        t = [time.perf_counter()]
        batch = stream.next()
        t.append(time.perf_counter())
        out = model(batch.x, return_weights=True)
        t.append(time.perf_counter())
        err = out.out - batch.y
        loss = err.pow(2).mean(dim=(1, 2, 3))
        linf = err.detach().abs().amax(dim=(1, 2, 3))
        bool(((linf < 5e-3) | ~torch.isfinite(loss)).any())
        t.append(time.perf_counter())
        opt.zero_grad()
        loss.sum().backward()
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        return [b - a for a, b in zip(t, t[1:])]

    for _ in range(10):
        step()
    totals = [0.0] * len(PARTS)
    engine = model.engine(cfg.task.seq_len)
    for _ in range(steps):
        totals = [a + b for a, b in zip(totals, step())]
    total = sum(totals)
    parts = ", ".join(f"{name} {1000 * v / steps:.2f} ms ({100 * v / total:.0f}%)"
                      for name, v in zip(PARTS, totals))
    print(f"{layers}x{heads} x {members} ({engine}): {1000 * total / steps:.2f} ms/step, "
          f"{members * steps / total:.0f} model-steps/s; {parts}")
    if engine == "kernel":
        kernel_alone(cfgs[0], members, steps)
    if ops:
        with torch.profiler.profile() as prof:
            for _ in range(20):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ops,
                                        max_name_column_width=36))


def kernel_alone(cfg, members: int, steps: int) -> None:
    """One layer's fused kernel by itself, on the training step's shapes: its share of a step
    and the arithmetic rate of the folded products it computes."""
    from sinklab import kernels

    heads, t, d, b = cfg.model.n_heads, cfg.task.seq_len, cfg.task.d_model, cfg.train.batch_size
    x = torch.randn(members, b, t, d, requires_grad=True)
    a = (torch.randn(members, heads, d, d) * 0.1).requires_grad_()
    m = (torch.randn(members, heads, d, d) * 0.1).requires_grad_()
    grad = torch.randn(members, b, t, d)
    timings = {"forward": 0.0, "backward": 0.0}
    for i in range(steps + 10):
        start = time.perf_counter()
        out = kernels.FusedAttention.apply(x, a, m, cfg.model.attention)[0]
        middle = time.perf_counter()
        torch.autograd.grad(out, [x, a, m], grad)
        if i >= 10:
            timings["forward"] += middle - start
            timings["backward"] += time.perf_counter() - middle
    flops = 2 * members * b * heads * (2 * t * d * d + 2 * t * t * d)  # folded, one layer
    parts = ", ".join(f"{name} {1e6 * v / steps:.0f} us ({k * flops * steps / v / 1e9:.1f} "
                      "GFLOP/s)" for (name, v), k in zip(timings.items(), (1, 2)))
    print(f"    kernel alone, one layer: {parts}; {cfg.model.n_layers} layers "
          f"{1e3 * sum(timings.values()) * cfg.model.n_layers / steps:.2f} ms of the step")


def reference_data(batches: int = 30) -> None:
    """The reference-style data path: one sequence at a time, collated 128 per batch."""
    import sys
    from pathlib import Path

    from torch.utils.data import DataLoader

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_loop import TriggerSequences

    loader = iter(DataLoader(TriggerSequences(16, 16, False, 0), batch_size=128))
    next(loader)
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    print(f"reference-style data: {1000 * (time.perf_counter() - start) / batches:.2f} ms per "
          "batch of 128")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ops", type=int, default=0, help="also list the N costliest ops")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    reference_data()
    for layers, heads, members in ((1, 1, 1), (2, 2, 1), (4, 4, 1), (1, 1, 32)):
        profile(layers, heads, members, args.steps, args.ops)


if __name__ == "__main__":
    main()
