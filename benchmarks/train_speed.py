"""Training speed of sinklab against a reference-style loop, on the paper's 1x1 and 2x2 models.

    python benchmarks/train_speed.py            # the full table (about five minutes)
    python benchmarks/train_speed.py --quick    # one round, fewer steps: a smoke check

Each measurement runs in a fresh process (so peak memory is its own) and reports:
(a) the reference-style loop of ``reference_loop.py``: one sequence at a time, DataLoader
collation, one model, ``.item()`` every step, with torch's default threads as such code runs
(and, for comparison only, with one thread); (b) one sinklab model, which picks its own
threads; (c) sinklab ensembles of 8, 32 and 128 members. Printed per row: model-steps per
second, the ratio to (a), achieved GFLOP/s (analytic count of each path's own training step,
``step_flops``) as a fraction of a float32 matmul peak measured
in the same run, and the process's peak resident memory. Every row is measured ``--rounds``
times, interleaved with the others, and the best is kept. The ratios are the result; absolute
speeds on shared machines vary between runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def step_flops(n_layers: int, n_heads: int, *, folded: bool, batch: int = 128, seq_len: int = 16,
               d: int = 16) -> float:
    """Multiply-adds x 2 of one training step (forward and a backward of twice the forward).

    The reference computes four d x d projections per head (Q, K, V and its block of W_O);
    sinklab's folded form computes two (x A_h and x M_h) after two d x d x d weight products.
    """
    if folded:
        projections = 2 * 2 * batch * seq_len * d * d + 2 * 2 * d**3
    else:
        projections = 4 * 2 * batch * seq_len * d * d
    attention = 2 * 2 * batch * seq_len * seq_len * d  # scores and weights @ V
    return 3 * n_layers * n_heads * (projections + attention)


def matmul_peak(threads: int) -> float:
    """GFLOP/s of a large float32 matmul with ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 2048**3 / best / 1e9


def measure_reference(layers: int, heads: int, steps: int, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from reference_loop import train

    train(layers, heads, 20)  # warm-up
    return train(layers, heads, steps)["steps_per_s"]


def measure_sinklab(layers: int, heads: int, members: int, steps: int, threads: int) -> float:
    import torch

    from sinklab.config import build_run_config
    from sinklab.train import train_runs

    torch.set_num_threads(threads)

    def run(n_steps: int) -> float:
        cfgs = [build_run_config({
            "model": {"n_layers": layers, "n_heads": heads},
            "train": {"seed": s, "max_steps": n_steps, "tol": 1e-30, "log_every": 100},
            "eval": {"n_sequences": 8}}) for s in range(members)]
        summaries = train_runs(cfgs, progress=False)
        return max(s["train_time_s"] for s in summaries)

    run(10)  # warm-up
    return members * steps / run(steps)


def _child(kind: str, args: tuple, queue: mp.Queue) -> None:
    fn = measure_reference if kind == "reference" else measure_sinklab
    value = fn(*args)
    queue.put((value, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def in_process(kind: str, *args) -> tuple[float, float]:
    """Run one measurement in a fresh process: (model-steps/s, peak RSS in MiB)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps, one round, ensembles of 8 only (a smoke check)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every row this many times, interleaved, and keep the "
                             "best (default: 3); shared machines slow down in bursts")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for every row (default: all cores)")
    args = parser.parse_args()
    import os

    threads = args.threads or os.cpu_count() or 1
    ensembles = (8,) if args.quick else (8, 32, 128)
    rounds = 1 if args.quick else args.rounds
    peak = max(matmul_peak(threads) for _ in range(rounds))
    print(f"float32 matmul peak (2048^3, {threads} threads, best of {rounds}): "
          f"{peak:.1f} GFLOP/s")
    header = (f"{'config':6} {'path':24} {'model-steps/s':>14} {'x ref':>7} {'GFLOP/s':>8} "
              f"{'% peak':>7} {'peak MiB':>9}")
    print(header)
    print("-" * len(header))
    for layers, heads in ((1, 1), (2, 2)):
        base = 150 if args.quick else 600
        jobs = [("(a) reference loop", "reference", (layers, heads, base, threads)),
                ("(a) reference, 1 thread", "reference", (layers, heads, base, 1)),
                ("(b) sinklab, 1 model", "sinklab", (layers, heads, 1, base, threads))]
        for members in ensembles:
            steps = max(20, base * 8 // members) if layers == 1 else max(10, base * 2 // members)
            jobs.append((f"(c) ensemble of {members}", "sinklab",
                         (layers, heads, members, steps, threads)))
        best = {name: (0.0, 0.0) for name, _, _ in jobs}
        for _ in range(rounds):  # interleaved, so a slow spell hits every row alike
            for name, kind, job_args in jobs:
                rate, mem = in_process(kind, *job_args)
                best[name] = (max(best[name][0], rate), max(best[name][1], mem))
        ref = best[jobs[0][0]][0]
        for name, (rate, mem) in best.items():
            gflops = rate * step_flops(layers, heads, folded="reference" not in name) / 1e9
            print(f"{layers}x{heads:<4} {name:24} {rate:14.1f} {rate / ref:7.2f} {gflops:8.2f} "
                  f"{100 * gflops / peak:6.1f}% {mem:9.0f}", flush=True)


if __name__ == "__main__":
    main()
