"""The whole training step on the kernel (sinklab.kernels.TrainStep) against autograd, its
arithmetic floor, and what a step costs in two processes side by side.

    python benchmarks/whole_step.py                  # everything below, about 2 minutes
    python benchmarks/whole_step.py --skip-workers   # without the side-by-side section
    python benchmarks/whole_step.py --trained results/reproduce/runs/4x4_softmax_seed0

1. The float32 matmul peak of one thread (2048^3, best of 3), the rate every floor is taken at.
2. For the paper's 1x1, 2x2 and 4x4 models alone and the 1x1 ensemble of 32, milliseconds per
   step as ``sinklab.train`` runs it, with each part: the data, the kernel's step (every layer
   forward and backward, loss and L-infinity error), the stop check and Adam; then the same
   step on autograd (FusedAttention per layer, PyTorch around it), the ratio of the two, and
   the roofline: the step's arithmetic (``step_flops``) at the matmul peak.
3. Why a step is slower in two workers: the 4x4 step (whole, and on autograd as it was before
   the whole step), a loop of register-only vector FMAs
   (no memory traffic: the kernel on one sequence, whose workspace stays in L1) and a memory
   stream (a 256 MiB copy) each timed alone and then in two processes started together, each
   process timing its own work; and two 4x4 members as one ensemble on two threads.

4. With ``--trained RUN``: the 4x4 step at a trained model's weights against its starting
   weights, on autograd with subnormal floats kept and flushed, and on the whole step.

Every figure is the best of several repeats, measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from sinklab import kernels
from sinklab.config import build_run_config, derive_seed
from sinklab.task import TrainStream
from sinklab.train import MemberAdam, build_ensemble

CONFIGS = [(1, 1, 1), (2, 2, 1), (4, 4, 1), (1, 1, 32)]  # layers, heads, members


def best_of(fn, repeats: int = 5, calls: int = 50) -> float:
    """Seconds per call of ``fn``, the best mean of ``repeats`` runs of ``calls`` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_peak(threads: int = 1) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    return 2 * 2048**3 / best_of(lambda: a @ b, repeats=3, calls=1) / 1e9


def step_flops(layers: int, heads: int, batch: int, seq: int, d: int) -> float:
    """The arithmetic of one member's training step on the kernel: per head and sequence the
    forward's four products (x A, x M, the scores, the weighted values: 2 T D^2 + 2 T^2 D
    multiply-adds) and the backward's eight (twice the forward), with the causal halves
    counted in full, as the kernel's vectors compute them."""
    forward = 2 * (2 * seq * d * d + 2 * seq * seq * d)
    return 3 * forward * heads * layers * batch


def setup(layers: int, heads: int, members: int, rule: str = "softmax"):
    cfgs = [build_run_config({"model": {"attention": rule, "n_layers": layers,
                                        "n_heads": heads}, "train": {"seed": s}})
            for s in range(members)]
    cfg = cfgs[0]
    model = build_ensemble(cfgs, torch.device("cpu"))
    opt = MemberAdam(list(model.parameters()), torch.full((members,), cfg.train.lr),
                     (cfg.train.beta1, cfg.train.beta2), cfg.train.adam_eps)
    gens = [torch.Generator().manual_seed(derive_seed(c.train.seed, "data")) for c in cfgs]
    stream = TrainStream(cfg.task, cfg.train.batch_size, gens, residual=cfg.residual)
    return cfg, model, opt, stream


def whole_step_parts(layers: int, heads: int, members: int) -> dict[str, float]:
    """Seconds per step of each part of the whole step, and of the same step on autograd."""
    cfg, model, opt, stream = setup(layers, heads, members)
    step = kernels.TrainStep.build(model, opt, cfg.task.seq_len)
    batch = stream.next()
    loss, linf, _ = step(batch.x, batch.y)
    tol = cfg.train.tol

    def stop() -> None:
        bool(((linf < tol) | ~torch.isfinite(loss)).any())

    def whole() -> None:
        b = stream.next()
        lo, li, _ = step(b.x, b.y)
        bool(((li < tol) | ~torch.isfinite(lo)).any())
        opt.step()

    times = {"data": best_of(stream.next), "kernel": best_of(lambda: step(batch.x, batch.y)),
             "stop": best_of(stop), "adam": best_of(lambda: opt.step()),
             "whole": best_of(whole)}
    cfg, model, opt, stream = setup(layers, heads, members)

    def autograd() -> None:
        b = stream.next()
        out = model(b.x, return_weights=True)
        err = out.out - b.y
        lo = err.pow(2).mean(dim=(1, 2, 3))
        li = err.detach().abs().amax(dim=(1, 2, 3))
        bool(((li < tol) | ~torch.isfinite(lo)).any())
        opt.zero_grad()
        lo.sum().backward()
        opt.step()

    times["autograd"] = best_of(autograd)
    return times


def worker(kind: str, start_at: float) -> None:
    """One side of section 3: wait for ``start_at`` (time.time()), then time ``kind``."""
    torch.set_num_threads(1)
    if kind == "stream":
        src, dst = torch.empty(64 << 20), torch.empty(64 << 20)  # 256 MiB each
        src.fill_(1.0)
        fn, calls = (lambda: dst.copy_(src)), 5
    else:
        cfg, model, opt, stream = setup(4, 4, 1)
        step = kernels.TrainStep.build(model, opt, cfg.task.seq_len)
        batch = stream.next()
        if kind == "registers":  # one sequence: every operand stays in L1
            x, y = batch.x[:, :1].contiguous(), batch.y[:, :1].contiguous()
            fn, calls = (lambda: step(x, y)), 2000
        elif kind == "autograd":  # the step as it was: FusedAttention per layer, autograd
            def fn() -> None:
                out = model(batch.x).out
                loss = (out - batch.y).pow(2).mean(dim=(1, 2, 3))
                opt.zero_grad()
                loss.sum().backward()
                opt.step()
            calls = 50
        else:
            fn, calls = (lambda: step(batch.x, batch.y)), 100
        fn()
    while time.time() < start_at:
        time.sleep(0.001)
    print(json.dumps({"kind": kind, "seconds": best_of(fn, repeats=7, calls=calls)}))


def side_by_side(kind: str, processes: int) -> list[float]:
    start_at = time.time() + 3.0  # every process has loaded torch and built its step by then
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", kind, str(start_at)],
                              stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1])["seconds"] for p in procs]


def two_thread_ensemble() -> float:
    """Seconds per member-step of two 4x4 members as one ensemble on two threads."""
    torch.set_num_threads(2)
    cfg, model, opt, stream = setup(4, 4, 2)
    step = kernels.TrainStep.build(model, opt, cfg.task.seq_len)
    batch = stream.next()
    return best_of(lambda: step(batch.x, batch.y)) / 2


def trained_weights(run_dir: str) -> None:
    """Section 4: the 4x4 step at a trained model's weights (a finished ``sinklab reproduce``
    4x4 run), where the softmax's far keys give subnormal products, against the same step at the
    weights it started from: autograd with subnormals kept and flushed
    (``torch.set_flush_denormal``), and the whole step (which flushes them itself)."""
    from sinklab.train import load_model

    torch.set_num_threads(1)
    cfg, trained = load_model(run_dir)
    fresh = build_ensemble([cfg], torch.device("cpu"))
    stream = TrainStream(cfg.task, cfg.train.batch_size, [torch.Generator().manual_seed(0)],
                         residual=cfg.residual)
    batch = stream.next()
    print(f"\n4x4 step at the weights it starts from and at a trained model's ({run_dir}):")
    for name, model in (("start", fresh), ("trained", trained)):
        opt = MemberAdam(list(model.parameters()), torch.tensor([cfg.train.lr]),
                         (cfg.train.beta1, cfg.train.beta2), cfg.train.adam_eps)
        step = kernels.TrainStep.build(model, opt, cfg.task.seq_len)

        def autograd() -> None:
            loss = (model(batch.x).out - batch.y).pow(2).mean(dim=(1, 2, 3))
            opt.zero_grad()
            loss.sum().backward()

        kept = best_of(autograd)
        torch.set_flush_denormal(True)
        flushed = best_of(autograd)
        torch.set_flush_denormal(False)
        whole = best_of(lambda: step(batch.x, batch.y))
        print(f"  {name:8s} autograd forward+backward {1000 * kept:.2f} ms, with subnormals "
              f"flushed {1000 * flushed:.2f} ms; whole step's kernel {1000 * whole:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-workers", action="store_true",
                        help="leave out section 3 (two processes side by side)")
    parser.add_argument("--trained", metavar="RUN",
                        help="a finished 4x4 run folder (sinklab reproduce's "
                             "runs/4x4_softmax_seed0): also time the step at its weights")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "START"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], float(args.worker[1]))
        return
    if kernels.engine("softmax", 16, 16) != "kernel":
        sys.exit("the kernel is not available here (no C compiler, or SINKLAB_KERNEL=0).")
    peak = matmul_peak(1)
    print(f"torch {torch.__version__}; float32 matmul peak (2048^3, 1 thread, best of 3): "
          f"{peak:.1f} GFLOP/s")
    torch.set_num_threads(1)
    print("config      whole step  data   kernel  stop   adam  | autograd  ratio | kernel "
          "GFLOP/s  % peak  floor at peak")
    for layers, heads, members in CONFIGS:
        t = whole_step_parts(layers, heads, members)
        flops = step_flops(layers, heads, 128, 16, 16) * members
        rate = flops / t["kernel"] / 1e9
        ms = {k: 1000 * v for k, v in t.items()}
        print(f"{layers}x{heads} x {members:<3}  {ms['whole']:7.2f} ms {ms['data']:5.2f} "
              f"{ms['kernel']:7.2f} {ms['stop']:5.2f} {ms['adam']:5.2f} | {ms['autograd']:6.2f} "
              f"ms {t['autograd'] / t['whole']:5.2f}x | {rate:9.1f} {100 * rate / peak:6.0f}% "
              f"{1000 * flops / peak / 1e9:8.2f} ms")
    if args.trained:
        trained_weights(args.trained)
    if args.skip_workers:
        return
    print("\none process alone against two side by side (each timing its own work, best of 7):")
    for kind, what in (("step", "4x4 whole step, batch 128"),
                       ("autograd", "4x4 step on autograd (per-layer kernel), batch 128"),
                       ("registers", "4x4 whole step on 1 sequence (in L1: register FMAs)"),
                       ("stream", "256 MiB copy (memory bandwidth)")):
        alone = side_by_side(kind, 1)[0]
        pair = side_by_side(kind, 2)
        unit = 1000 if kind != "registers" else 1e6
        label = "ms" if kind != "registers" else "us"
        print(f"  {what:54s} alone {unit * alone:8.2f} {label}, side by side "
              + ", ".join(f"{unit * p:.2f}" for p in pair)
              + f" {label}: x{max(pair) / alone:.2f}")
    both = two_thread_ensemble()
    alone = side_by_side("step", 1)[0]
    print(f"  two 4x4 members as one ensemble on two threads: {1000 * both:.2f} ms per "
          f"member-step, against {1000 * alone:.2f} ms alone (x{both / alone:.2f} per member, "
          f"{alone / both:.2f} member-steps per single-model step time)")


if __name__ == "__main__":
    main()
