"""The language models' training step: tokens per second and the share of the machine's matmul
peak, side by side with the same model written in plain PyTorch operators.

    python benchmarks/pretrain_speed.py            # sinklab pretrain's CPU preset
    python benchmarks/pretrain_speed.py --steps 5  # fewer steps per measurement

1. The peaks: the float32 and bfloat16 matmul rates of this machine with the threads torch uses
   (a square product large enough to saturate it), the best of a few tries.
2. The step (forward, loss, backward, AdamW) of ``sinklab.pretrain.network.LanguageModel`` with
   softmax attention (on PyTorch's fused attention, as it trains) and with ReLU attention (its
   weights materialised, as every rule but softmax), each in float32 and under bfloat16
   autocast over float32 weights (``train.precision``), against ``PlainLM`` below in float32:
   the same weights, the same computation in ``nn.Linear``, ``F.scaled_dot_product_attention``
   (fused) or a materialised masked softmax, and ``nn.LayerNorm``, with no rule registry and no
   hooks. The outputs are checked to agree first. Measured alternately in one run (these
   machines are noisy), the median of each; each row's share is of its own precision's peak.
3. Every rule of the study at the same size in bfloat16 (the value-side rules run their heads'
   ``mix``), and its tokens/s against softmax's.

Whether bfloat16 trains as well as float32 is not measured here but by the pretraining pilot's
precision check (the same seeds and settings in both, validation losses compared at 2M tokens
within a tolerance stated before it ran; docs/language.md).

The model's FLOPs per step are counted from its matrix products (forward: the four attention
projections, the MLP, the scores and the weighted sum over the causal half, the output head;
backward: twice the forward), so the share of the peak is what the step gets out of the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinklab.pretrain import data
from sinklab.pretrain.network import LanguageModel, rotary_tables, rotate
from sinklab.pretrain.runconfig import PretrainConfig, step_flops
from sinklab.pretrain.training import BETAS, shape
from sinklab.studies.pretrain import NEW_RULES, PRESETS, RULES


def matmul_peak(size: int = 2048, tries: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a (size x size) @ (size x size) product in ``dtype``, the best of ``tries``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # warm up
    best = 0.0
    for _ in range(tries):
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


class PlainLM(nn.Module):
    """The same model as ``LanguageModel`` with softmax attention, in plain PyTorch operators;
    built from a ``LanguageModel``'s weights (shared, not copied)."""

    def __init__(self, model: LanguageModel, explicit: bool = False) -> None:
        super().__init__()
        self.src = model
        self.heads, self.dh = model.shape.n_heads, model.shape.d_head
        self.explicit = explicit  # the weights materialised: matmul, masked softmax, matmul

    def forward(self, ids: Tensor) -> Tensor:
        src = self.src
        batch, seq = ids.shape
        h = src.embed(ids)
        cos, sin = rotary_tables(seq, self.dh, h.device, h.dtype)
        for block in src.layers:
            x = block.norm1(h)
            attn = block.attn

            def split(t: Tensor) -> Tensor:
                return t.view(batch, seq, self.heads, self.dh).transpose(1, 2)

            q = rotate(split(attn.w_q(x)), cos, sin)
            k = rotate(split(attn.w_k(x)), cos, sin)
            v = split(attn.w_v(x))
            if self.explicit:
                scores = (q @ k.transpose(-1, -2)) * self.dh ** -0.5
                causal = torch.ones(seq, seq, dtype=torch.bool).tril()
                y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + attn.w_o(y.transpose(1, 2).reshape(batch, seq, -1))
            h = h + block.mlp(block.norm2(h))
        return src.head(src.norm(h))


def time_steps(forward, params, ids: Tensor, steps: int, bf16: bool = False) -> list[float]:
    """Seconds per training step (forward, loss, backward, AdamW), as ``sinklab pretrain``
    takes it: with ``bf16`` the forward under bfloat16 autocast, the loss in float32."""
    opt = torch.optim.AdamW(params, lr=1e-4, betas=BETAS)
    times = []
    for _ in range(steps + 1):  # the first is a warm-up
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                               ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    args = parser.parse_args()
    torch.manual_seed(0)
    preset = PRESETS["cpu"]
    cfg = PretrainConfig.make(**{**preset, "corpus": "pydoc", "device": "cpu"})
    stream = data.split("pydoc", 0.1).train
    ids = data.train_batch(stream, cfg.train.batch_size, cfg.model.context, 0, 0, True)
    peak = matmul_peak()
    peak_bf16 = matmul_peak(dtype=torch.bfloat16)
    flops = step_flops(cfg)
    tokens = cfg.train.batch_size * cfg.model.context
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s in float32, {peak_bf16 / 1e9:.1f} in bfloat16")
    print(f"model: {cfg.model.n_layers} layers x {cfg.model.n_heads} heads, d_model "
          f"{cfg.model.d_model}, context {cfg.model.context}, batch {cfg.train.batch_size}: "
          f"{flops / 1e9:.2f} GFLOP per step ({tokens:,} tokens)")

    model = LanguageModel(shape(cfg))
    plain = PlainLM(model)
    with torch.no_grad():
        gap = float((model(ids).logits - plain(ids)).abs().max())
    print(f"sinklab and plain outputs agree to {gap:.2e} (max |difference| of the logits)")

    explicit = PlainLM(model, explicit=True)
    relu = LanguageModel(shape(cfg.replace(attention="relu")))
    weights_path = LanguageModel(shape(cfg))  # softmax through its weights, not fused
    for block in weights_path.layers:
        block.attn.fused = False
    rows: dict[str, list[float]] = {}
    timed = (("sinklab, softmax, bfloat16", lambda x: model(x).logits, model, True),
             ("sinklab, softmax, bfloat16, weights", lambda x: weights_path(x).logits,
              weights_path, True),
             ("sinklab, softmax, float32", lambda x: model(x).logits, model, False),
             ("sinklab, softmax, float32, weights", lambda x: weights_path(x).logits,
              weights_path, False),
             ("plain PyTorch, SDPA, float32", plain, model, False),
             ("sinklab, relu, bfloat16", lambda x: relu(x).logits, relu, True),
             ("sinklab, relu, float32", lambda x: relu(x).logits, relu, False),
             ("plain PyTorch, explicit, float32", explicit, model, False))
    for _ in range(3):  # alternately, so that drifts of the machine hit all of them
        for name, forward, owner, bf16 in timed:
            rows.setdefault(name, []).extend(
                time_steps(forward, owner.parameters(), ids, args.steps, bf16))
    for name, times in rows.items():
        step = statistics.median(times)
        share = flops / step / (peak_bf16 if "bfloat16" in name else peak)
        print(f"{name:>36}: {step * 1e3:7.1f} ms/step, {tokens / step:9,.0f} tokens/s, "
              f"{share:6.1%} of its precision's matmul peak")
    speed = {name: tokens / statistics.median(times) for name, times in rows.items()}
    print(f"tokens/s ratios: sinklab softmax bfloat16 / plain SDPA float32 "
          f"{speed['sinklab, softmax, bfloat16'] / speed['plain PyTorch, SDPA, float32']:.2f} "
          "(goal: at least 1.3); sinklab softmax float32 / plain SDPA float32 "
          f"{speed['sinklab, softmax, float32'] / speed['plain PyTorch, SDPA, float32']:.2f}; "
          "sinklab relu float32 / plain explicit float32 "
          f"{speed['sinklab, relu, float32'] / speed['plain PyTorch, explicit, float32']:.2f}")

    gpu = PretrainConfig.make(**{**PRESETS["gpu"], "corpus": "pydoc", "device": "cpu"})
    run_flops = step_flops(gpu) * gpu.steps
    softmax_rate = flops / statistics.median(rows["sinklab, softmax, bfloat16"])
    print(f"the gpu preset ({gpu.model.n_layers} layers x {gpu.model.n_heads} heads, d_model "
          f"{gpu.model.d_model}, context {gpu.model.context}, {gpu.train.tokens:,} tokens a run): "
          f"{run_flops / 1e15:.1f} PFLOP a run; at this machine's sinklab softmax bfloat16 rate "
          f"({softmax_rate / 1e9:.1f} GFLOP/s) {run_flops / softmax_rate / 86400:.1f} days a run, "
          "on a GPU the same FLOPs at its own rate")

    print("every rule of the study, sinklab's model at the same size, in bfloat16 (as the "
          "pilot's protocols train):")
    base = None
    for rule in ("softmax", *[r for r in (*RULES, *NEW_RULES) if r != "softmax"], "uniform"):
        lm = LanguageModel(shape(cfg.replace(attention=rule)))
        step = statistics.median(time_steps(lambda x, lm=lm: lm(x).logits, lm.parameters(),
                                            ids, args.steps, bf16=True))
        base = base or step
        print(f"{rule:>24}: {step * 1e3:7.1f} ms/step, {tokens / step:9,.0f} tokens/s, "
              f"{base / step:5.2f}x softmax's, {flops / step / peak_bf16:6.1%} of the "
              "bfloat16 matmul peak")


if __name__ == "__main__":
    main()
