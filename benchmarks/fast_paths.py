"""Candidate fast paths measured side by side, so the profile decides which sinklab uses.

    python benchmarks/fast_paths.py

1. The attention products: sinklab's folded form (W_Q W_K^T and W_V W_O multiplied first, three
   large products per layer, heads summed inside the last one) against the plain per-head form
   (Q, K, V as three batched products, heads ahead of the batch, W_O per head, then a sum) and
   a fused QKV product. Outputs are checked to agree.
2. ``torch.compile`` of the forward and loss: step time and compile time, from an empty cache.
3. One versus two threads, per configuration.
4. The cost of reading the stop flag to the host every step.
"""

from __future__ import annotations

import os
import tempfile
import time

# Compile from scratch: a warm on-disk inductor cache would hide the compile time.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="sinklab-inductor-"))

import torch  # noqa: E402

from sinklab.attention import causal_mask  # noqa: E402
from sinklab.config import build_run_config  # noqa: E402
from sinklab.model import Attention  # noqa: E402
from sinklab.task import TrainStream  # noqa: E402
from sinklab.train import build_ensemble  # noqa: E402


def per_head_forward(attn: Attention, x: torch.Tensor, mask: torch.Tensor,
                     fused: bool = False) -> torch.Tensor:
    """The plain form: per-head Q, K, V (three products, or one fused QKV product and a copy)."""
    n, batch, seq, d = x.shape
    heads = attn.w_q.shape[1]
    if fused:
        w = torch.cat([attn.w_q, attn.w_k, attn.w_v], dim=1).permute(0, 2, 1, 3)
        qkv = x.reshape(n, batch * seq, d) @ w.reshape(n, d, 3 * heads * d)
        qkv = qkv.view(n, batch, seq, 3 * heads, d).permute(0, 3, 1, 2, 4).contiguous()
        q, k, v = qkv.view(n, 3, heads, batch, seq, d).unbind(1)
    else:
        xs = x.reshape(n, 1, batch * seq, d)
        q, k, v = ((xs @ w).view(n, heads, batch, seq, d)
                   for w in (attn.w_q, attn.w_k, attn.w_v))
    weights = attn.rule(q @ k.transpose(-1, -2), mask)
    out = (weights @ v).view(n, heads, batch * seq, d) @ attn.w_o
    return out.sum(dim=1).view(n, batch, seq, d)


def timed(fn, repeats: int = 60) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return 1000 * best


def setup(layers: int, heads: int, members: int):
    cfgs = [build_run_config({"model": {"n_layers": layers, "n_heads": heads},
                              "train": {"seed": s}}) for s in range(members)]
    model = build_ensemble(cfgs, torch.device("cpu"))
    stream = TrainStream(cfgs[0].task, 128, [torch.Generator().manual_seed(s)
                                             for s in range(members)],
                         residual=cfgs[0].residual)
    return model, stream.next()


def product_forms() -> None:
    print("1. attention products: forward + backward, ms (1 thread)")
    torch.set_num_threads(1)
    for layers, heads, members in ((1, 1, 1), (2, 2, 1), (4, 4, 1), (2, 2, 8), (1, 1, 32)):
        model, batch = setup(layers, heads, members)
        mask = causal_mask(16)

        def run(form: str) -> torch.Tensor:
            h = batch.x
            for block in model.blocks:
                if form == "folded":
                    y = block.attn(h, mask)[0]
                else:
                    y = per_head_forward(block.attn, h, mask, fused=form == "fused")
                h = h + y if model.residual else y
            return h

        for form in ("per-head", "fused"):
            torch.testing.assert_close(run(form), run("folded"), rtol=1e-4, atol=1e-5)
        t = {form: timed(lambda: run(form).pow(2).mean().backward())
             for form in ("folded", "per-head", "fused")}
        print(f"   {layers}x{heads} x {members:<3} folded {t['folded']:7.2f}   per-head "
              f"{t['per-head']:7.2f}   fused QKV {t['fused']:7.2f}   per-head/folded "
              f"{t['per-head'] / t['folded']:.2f}")


def compile_path() -> None:
    print("2. torch.compile of forward + loss: ms per training step (1 thread)")
    torch.set_num_threads(1)
    for layers, heads, members in ((1, 1, 1), (2, 2, 1), (4, 4, 1), (1, 1, 32)):
        model, batch = setup(layers, heads, members)

        def loss_fn(x, y):
            return (model(x).out - y).pow(2).mean(dim=(1, 2, 3)).sum()

        eager = timed(lambda: loss_fn(batch.x, batch.y).backward(), 40)
        compiled_fn = torch.compile(loss_fn)
        start = time.perf_counter()
        compiled_fn(batch.x, batch.y).backward()
        compile_s = time.perf_counter() - start
        compiled = timed(lambda: compiled_fn(batch.x, batch.y).backward(), 40)
        saved = (eager - compiled) / 1000
        breakeven = compile_s / saved if saved > 0 else float("inf")
        print(f"   {layers}x{heads} x {members:<3} eager {eager:6.2f}  compiled {compiled:6.2f}"
              f"  compile {compile_s:5.1f} s  pays off after {breakeven:,.0f} steps")


def thread_counts() -> None:
    print("3. threads: forward + backward, ms")
    for layers, heads, members in ((1, 1, 1), (2, 2, 1), (4, 4, 1), (1, 1, 32), (2, 2, 8)):
        model, batch = setup(layers, heads, members)
        times = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times.append(timed(lambda: (model(batch.x).out - batch.y).pow(2).mean().backward()))
        print(f"   {layers}x{heads} x {members:<3} 1 thread {times[0]:7.2f}  2 threads "
              f"{times[1]:7.2f}  (2 threads / 1 thread {times[1] / times[0]:.2f})")


def host_read() -> None:
    print("4. reading the stop flag to the host every step (CPU tensors)")
    flag = torch.zeros(32, dtype=torch.bool)
    us = 1000 * timed(lambda: bool(flag.any()), 2000)
    print(f"   bool(flag.any()): {us:.1f} us per step")


def main() -> None:
    print(f"torch {torch.__version__}")
    product_forms()
    compile_path()
    thread_counts()
    host_read()


if __name__ == "__main__":
    main()
