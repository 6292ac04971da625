"""CUDA against the CPU: the same runs on both devices, then `sinklab reproduce --seeds 10` timed
on the GPU. The script a session with a GPU machine runs (docs/performance.md, "GPU").

    python benchmarks/cuda_check.py --out /tmp/cuda-check          # about 10 minutes on a GPU
    python benchmarks/cuda_check.py --out /tmp/cuda-check --skip-reproduce

1. The paper's 1x1 and 2x2 softmax and ReLU models, seeds 0-2, each trained as one ensemble
   per (configuration, rule) on the CPU (the engine it picks there) and on CUDA (PyTorch's
   operators): the stop steps side by side and the largest difference of each final metric.
2. `sinklab reproduce --seeds 10 --device cuda` (every seed of a configuration one ensemble on
   the device), its wall time, and its stop steps against the CPU's where a CPU folder is given
   (--cpu-reproduce DIR, a `sinklab reproduce --seeds 10` folder).
3. A language model of `sinklab pretrain` (the CPU preset's sizes, softmax and ReLU, 40 steps on
   pydoc text, interventions on) trained on both devices: the final validation loss and sink
   rate side by side, and tokens per second on each.

Exits with one sentence where this machine has no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

METRICS = ("linf_error", "linf_nontrigger", "linf_trigger", "mse", "bos_mass_nontrigger_min")


def train_both(out: Path) -> None:
    from sinklab.config import build_run_config
    from sinklab.train import train_runs

    print("config      rule     seed  cpu steps  cuda steps  largest metric difference")
    for layers, heads in ((1, 1), (2, 2)):
        for rule in ("softmax", "relu"):
            found = {}
            for device in ("cpu", "cuda"):
                cfgs = [build_run_config({"model": {"attention": rule, "n_layers": layers,
                                                    "n_heads": heads},
                                          "train": {"seed": s, "device": device}})
                        for s in range(3)]
                dirs = [out / device / f"{layers}x{heads}_{rule}_seed{s}" for s in range(3)]
                found[device] = train_runs(cfgs, dirs, progress=False)
            for s, (cpu, gpu) in enumerate(zip(found["cpu"], found["cuda"])):
                diffs = [abs(float(_scalar(cpu[k])) - float(_scalar(gpu[k])))
                         for k in METRICS if k in cpu and k in gpu]
                print(f"{layers}x{heads}  {rule:8s} {s:4d}  {cpu['steps']:9,d}  "
                      f"{gpu['steps']:10,d}  {max(diffs, default=float('nan')):.2e}")


def _scalar(value):
    """A metric as one number: the smallest entry of a per-layer or per-head list."""
    while isinstance(value, list):
        value = min(value, key=_scalar)
    return value


def reproduce(out: Path, cpu_folder: Path | None) -> None:
    folder = out / "reproduce-cuda"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sinklab", "reproduce", "--seeds", "10", "--device",
                    "cuda", "--out", str(folder)], check=True)
    print(f"sinklab reproduce --seeds 10 --device cuda: {time.perf_counter() - start:.0f} s wall")
    if cpu_folder is not None:
        subprocess.run([sys.executable, str(Path(__file__).with_name("stop_steps.py")),
                        str(cpu_folder), str(folder)], check=True)


def pretrain_both(out: Path) -> None:
    from sinklab.pretrain.runconfig import PretrainConfig
    from sinklab.pretrain.training import train
    from sinklab.studies.pretrain import PRESETS

    print("pretrain rule  device  val loss  sink rate  tokens/s")
    for rule in ("softmax", "relu"):
        for device in ("cpu", "cuda"):
            sizes = {**PRESETS["cpu"], "tokens": 40 * 16 * 256}
            cfg = PretrainConfig.make(**sizes, corpus="pydoc", attention=rule, device=device)
            summary = train(cfg, out / f"pretrain-{rule}-{device}")
            final = summary["final"]
            rate = sum(map(sum, final["sink_rate"])) / sum(map(len, final["sink_rate"]))
            print(f"{rule:>13}  {device:>6}  {final['val_loss']:8.4f}  {rate:9.3f}  "
                  f"{summary['tokens_per_s']:8,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs")
    parser.add_argument("--skip-reproduce", action="store_true",
                        help="leave out `sinklab reproduce --seeds 10` on the GPU")
    parser.add_argument("--cpu-reproduce", type=Path, metavar="DIR",
                        help="a CPU `sinklab reproduce --seeds 10` folder to compare with")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("cuda_check.py needs a CUDA device, and this machine has none.")
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"{args.out} is not empty: give a new folder for the runs.")
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}))
    train_both(args.out)
    pretrain_both(args.out)
    if not args.skip_reproduce:
        reproduce(args.out, args.cpu_reproduce)


if __name__ == "__main__":
    main()
