"""Training speed of sinklab against a reference-style loop, on the paper's 1x1, 2x2 and 4x4 models.

    python benchmarks/train_speed.py            # the full table (about ten minutes)
    python benchmarks/train_speed.py --quick    # one round, fewer steps: a smoke check

Each measurement runs in a fresh process (so peak memory is its own) and reports:
(a) the reference-style loop of ``reference_loop.py``: one sequence at a time, DataLoader
collation, one model, ``.item()`` every step, with torch's default threads as such code runs
(and, for comparison only, with one thread); (b) one sinklab model on the engine it picks
(the fused kernel of ``sinklab.kernels`` where it can be built), and on PyTorch's operators;
(c) sinklab ensembles of 8, 32 and 128 members. Printed per row: model-steps per second, the
ratio to (a), the threads the step's arithmetic ran on, achieved GFLOP/s (analytic count of each
path's own training step, ``step_flops``) as a fraction of a float32 matmul peak measured in the
same run for that many threads, and the process's peak resident memory. Every row is measured
``--rounds`` times, interleaved with the others, and the best is kept.

Then whole processes, start-up included: ``reference_loop.py`` training one 1x1 model for 400
steps against ``sinklab train --seeds 32`` training 32 for 400 steps and writing every run folder,
and what finishing a run costs in ``sinklab train --seeds 32`` (the wall time of
``train.max_steps=1`` with 32 seeds less that with one seed, per extra run).
The ratios are the result; absolute speeds on shared machines vary between runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
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


def sinklab_threads(layers: int, heads: int, members: int, threads: int, engine: str) -> int:
    """The threads a sinklab step's arithmetic runs on: ``sinklab.train.step_threads``, and on
    the fused kernel at most one per ensemble member (it splits an ensemble by members)."""
    import torch

    from sinklab.config import build_run_config
    from sinklab.train import step_threads

    torch.set_num_threads(threads)
    cfg = build_run_config({"model": {"n_layers": layers, "n_heads": heads}})
    used = step_threads(cfg, members, torch.device("cpu"))
    return min(used, members) if engine == "kernel" else used


def measure_sinklab(layers: int, heads: int, members: int, steps: int, threads: int,
                    engine: str = "auto") -> float:
    import torch

    from sinklab import kernels
    from sinklab.config import build_run_config
    from sinklab.train import train_runs

    torch.set_num_threads(threads)
    if engine == "pytorch":
        os.environ[kernels.ENV] = "0"

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


def whole_process(command: list[str]) -> float:
    """Wall seconds of one command run from start to exit."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def whole_processes(rounds: int, steps: int) -> None:
    """The whole-process rows: start-up, training and writing every run folder included."""
    sinklab = str(Path(sys.executable).with_name("sinklab"))
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            keep("reference", whole_process([sys.executable, str(HERE / "reference_loop.py"),
                                             "--steps", str(steps)]))
            for seeds, max_steps in ((32, steps), (32, 1), (1, 1)):
                out = Path(tmp) / f"r{r}-{seeds}-{max_steps}"
                keep(f"{seeds}x{max_steps}", whole_process(
                    [sinklab, "train", "--seeds", str(seeds), "--out", str(out),
                     f"train.max_steps={max_steps}"]))
    ref = steps / best["reference"]
    ours = 32 * steps / best[f"32x{steps}"]
    print(f"\nwhole processes, start-up included, best of {rounds}:")
    print(f"  reference_loop.py, one 1x1 model, {steps} steps: {best['reference']:.2f} s, "
          f"{ref:.1f} model-steps/s")
    print(f"  sinklab train --seeds 32, {steps} steps, 32 run folders: {best[f'32x{steps}']:.2f} "
          f"s, {ours:.1f} model-steps/s: {ours / ref:.2f}x the reference")
    per_run = (best["32x1"] - best["1x1"]) / 31
    print(f"  finishing a run in sinklab train --seeds 32 (train.max_steps=1: {best['32x1']:.2f} "
          f"s for 32 seeds, {best['1x1']:.2f} s for one): {1000 * per_run:.1f} ms per extra run")


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
    from sinklab import kernels

    threads = args.threads or os.cpu_count() or 1
    ensembles = (8,) if args.quick else (8, 32, 128)
    rounds = 1 if args.quick else args.rounds
    engine = kernels.engine("softmax", 16, 16)
    peaks = {n: max(matmul_peak(n) for _ in range(rounds)) for n in sorted({1, threads})}
    for n, peak in peaks.items():
        print(f"float32 matmul peak (2048^3, {n} thread(s), best of {rounds}): "
              f"{peak:.1f} GFLOP/s")
    print(f"sinklab's engine here: {engine} (sinklab.kernels)")
    header = (f"{'config':6} {'path':27} {'model-steps/s':>14} {'x ref':>7} {'threads':>7} "
              f"{'GFLOP/s':>8} {'% peak':>7} {'peak MiB':>9}")
    print(header)
    print("-" * len(header))
    for layers, heads in ((1, 1), (2, 2), (4, 4)):
        base = {1: 600, 2: 600, 4: 200}[layers] // (4 if args.quick else 1)
        jobs = [("(a) reference loop", "reference", (layers, heads, base, threads), threads),
                ("(a) reference, 1 thread", "reference", (layers, heads, base, 1), 1),
                ("(b) sinklab, 1 model", "sinklab", (layers, heads, 1, base, threads, engine),
                 sinklab_threads(layers, heads, 1, threads, engine))]
        if engine == "kernel":
            jobs.append(("(b) sinklab, PyTorch ops", "sinklab",
                         (layers, heads, 1, base, threads, "pytorch"),
                         sinklab_threads(layers, heads, 1, threads, "pytorch")))
        for members in ensembles if layers < 4 else ():
            steps = max(20, base * 8 // members) if layers == 1 else max(10, base * 2 // members)
            jobs.append((f"(c) ensemble of {members}", "sinklab",
                         (layers, heads, members, steps, threads, engine),
                         sinklab_threads(layers, heads, members, threads, engine)))
        best = {name: (0.0, 0.0) for name, *_ in jobs}
        for _ in range(rounds):  # interleaved, so a slow spell hits every row alike
            for name, kind, job_args, _ in jobs:
                rate, mem = in_process(kind, *job_args)
                best[name] = (max(best[name][0], rate), max(best[name][1], mem))
        ref = best[jobs[0][0]][0]
        for name, kind, _, used in jobs:
            rate, mem = best[name]
            gflops = rate * step_flops(layers, heads, folded=kind == "sinklab") / 1e9
            print(f"{layers}x{heads:<4} {name:27} {rate:14.1f} {rate / ref:7.2f} {used:7d} "
                  f"{gflops:8.2f} {100 * gflops / peaks[used]:6.1f}% {mem:9.0f}", flush=True)
    whole_processes(rounds, 100 if args.quick else 400)


if __name__ == "__main__":
    main()
