"""What hooks cost: the forward pass of a toy model and of SmolLM2 with no hook, with a no-op
hook on the residual stream, on the pattern (the folded PyTorch path or the hooked attention
function) and on each head's result (the per-head path), as ratios to the unhooked pass measured
in the same run (these machines are noisy; the ratios are what to read).

    python benchmarks/hooks_overhead.py [--no-lm]

The toy model is a 4x4 paper model on a batch of 128 sequences; SmolLM2 (if its package is
installed) runs 8 probes of 65 tokens. Each figure is the median of several repeats, the
variants taking turns within each repeat.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from sinklab.config import build_run_config
from sinklab.hooks import Hooks
from sinklab.model import AttentionStack
from sinklab.task import TrainStream


def median_ms(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each step's median time in ms; the steps take turns in every repeat, so that a slow
    spell of the machine falls on all of them alike."""
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def noop(tensor: torch.Tensor, name: str) -> None:
    return None


def variants(n_layers: int) -> dict[str, Hooks | None]:
    every = range(n_layers)
    return {
        "no hooks": None,
        "resid_post, every layer": Hooks({f"blocks.{i}.resid_post": noop for i in every}),
        "attn.pattern, every layer": Hooks({f"blocks.{i}.attn.pattern": noop for i in every}),
        "attn.result, every layer": Hooks({f"blocks.{i}.attn.result": noop for i in every}),
        "attn.result, one layer": Hooks({"blocks.0.attn.result": noop}),
    }


def report(title: str, timings: dict[str, float]) -> None:
    base = timings["no hooks"]
    print(title)
    for name, ms in timings.items():
        print(f"  {name:28s} {ms:8.2f} ms  x{ms / base:.2f}")


def toy(repeats: int) -> None:
    cfg = build_run_config({"model": {"n_layers": 4, "n_heads": 4}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    model.init_member(0, torch.Generator().manual_seed(0))
    x = TrainStream(cfg.task, 128, [torch.Generator().manual_seed(0)],
                    residual=cfg.residual).next().x
    with torch.no_grad():
        timings = median_ms({name: lambda hooks=hooks: model(x, hooks=hooks)
                             for name, hooks in variants(4).items()}, repeats)
    report("toy 4x4 model, 128 sequences of 16 tokens, forward only:", timings)


def smollm2(repeats: int) -> None:
    from sinklab.errors import LMError
    from sinklab.lm import capture, sources
    from sinklab.lm import loading as lm

    try:
        loaded = lm.load(sources.locate("smollm2"), torch.device("cpu"))
    except LMError as exc:
        print(f"SmolLM2 skipped: {exc}")
        return
    texts = sources.natural_texts()[:8]
    probes = lm.with_specials(loaded, lm.text_probes(loaded, texts, 64), True)
    with torch.no_grad():
        timings = median_ms({name: lambda hooks=hooks: capture.run(loaded.model, probes.ids,
                                                                    hooks=hooks)
                             for name, hooks in variants(loaded.n_layers).items()}, repeats)
    report(f"SmolLM2, {len(probes)} probes of {probes.ids.shape[1]} tokens, with its LM head:",
           timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-lm", action="store_true", help="the toy model only")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per variant")
    args = parser.parse_args()
    toy(args.repeats)
    if not args.no_lm:
        smollm2(max(3, args.repeats // 2))


if __name__ == "__main__":
    main()
