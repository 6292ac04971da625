"""One pretraining run: its settings, its training loop, what it logs, and how it resumes.

``PretrainConfig`` holds everything a run depends on (the corpus and its split, the model, the
optimiser and the token budget, what is measured and how often), checked on creation: a value
out of range is a ConfigError in one sentence, and a run that would not fit in memory is refused
before it starts (``run_bytes``, the estimate, never an allocation).

``train(cfg, folder)`` trains with AdamW (betas 0.9 / 0.95, weight decay on the weight matrices
and embeddings, none on biases, norms and a rule's own parameters), a linear warm-up and a
cosine decay to a tenth of the rate, gradients clipped at norm 1. Every ``log_every`` steps (and
at step 0 and the last) it measures the model on the fixed validation windows (``measure``)
and appends one line to ``curve.jsonl``, then keeps a checkpoint (``checkpoint.pt``, written
atomically). A run stopped at any moment resumes from its last checkpoint: the batches are drawn
per step (``sinklab.pretrain.data``), so the resumed run is the run that was not stopped. When
it ends it writes ``model.pt`` (the weights and the shape, what the interventions load) and
``summary.json`` (the last measurement, the time and the speed), and removes the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sinklab import metrics
from sinklab.attention import build_rule, check_contract, rule_info
from sinklab.config import check_device
from sinklab.definitions import GU_EPS
from sinklab.errors import ConfigError
from sinklab.hooks import Hooks
from sinklab.pretrain import data
from sinklab.pretrain.network import POSITIONS, LanguageModel, LMShape, parameter_count
from sinklab.runs import limits
from sinklab.runs.files import read_json, write_atomic, write_json
from sinklab.train import resolve_device

CURVE = "curve.jsonl"
CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
SUMMARY = "summary.json"
MAX_CONTEXT = 4096
MAX_WIDTH = 4096
MAX_LAYERS = 64
MAX_TOKENS = 10**11
BETAS = (0.9, 0.95)
MIN_LR_SHARE = 0.1  # the cosine decays to this share of the rate
CLIP = 1.0


@dataclass
class PretrainConfig:
    """One language-model run (module docstring); every value is checked on creation."""

    corpus: str = "bbc"  # bbc, pydoc or a path (sinklab.pretrain.data)
    validation: float = 0.1  # the share of documents held out
    fixed_first: bool = True  # BOS in front of every window
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    context: int = 256
    attention: str = "softmax"
    attention_args: dict[str, Any] = field(default_factory=dict)
    positions: str = "rotary"
    seed: int = 0
    lr: float = 1e-3
    warmup: int = 50  # steps
    weight_decay: float = 0.1
    batch_size: int = 16
    tokens: int = 1_000_000  # the budget: steps = tokens // (batch_size * context)
    log_every: int = 25  # steps between measurements
    eval_windows: int = 32
    device: str = "auto"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not allowed: {allowed}.")

        def count(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
                 name, f"it must be an integer from {low} to {high}")

        def number(name: str, low: float, high: float, open_low: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and (value > low if open_low else value >= low) \
                and value <= high
            need(ok, name, f"it must be a number {'above' if open_low else 'from'} {low} "
                           f"{'and at most' if open_low else 'to'} {high}")

        need(isinstance(self.corpus, str) and bool(self.corpus), "corpus",
             f"give one of {', '.join(data.CORPORA)} or the path of a text file or folder")
        number("validation", 0.0, 0.5, open_low=True)
        need(isinstance(self.fixed_first, bool), "fixed_first", "it must be true or false")
        count("d_model", 8, MAX_WIDTH)
        count("n_heads", 1, self.d_model if isinstance(self.d_model, int) else 1)
        need(self.d_model % self.n_heads == 0 and (self.d_model // self.n_heads) % 2 == 0,
             "n_heads", f"d_model {self.d_model} must split into that many heads of an even "
                        "width (rotary positions turn pairs of dimensions)")
        count("n_layers", 1, MAX_LAYERS)
        count("context", 8, MAX_CONTEXT)
        need(self.positions in POSITIONS, "positions", f"choose one of {', '.join(POSITIONS)}")
        try:
            info = rule_info(self.attention)
            self.attention_args = info.check_kwargs(dict(self.attention_args),
                                                    prefix="attention_args.")
            check_contract(self.attention, self.attention_args)
            build_rule(self.attention, 1, self.n_heads, self.d_model,
                       self.d_model // self.n_heads, **self.attention_args)
        except ValueError as exc:  # an unknown rule, a bad argument, a broken contract
            raise ConfigError(str(exc)) from None
        count("seed", 0, 2**31 - 1)
        number("lr", 0.0, 1.0, open_low=True)
        count("warmup", 0, 10**7)
        number("weight_decay", 0.0, 100.0)
        count("batch_size", 1, 4096)
        count("tokens", 1, MAX_TOKENS)
        need(self.tokens >= self.batch_size * self.context, "tokens",
             f"the budget must hold at least one batch of {self.batch_size} windows of "
             f"{self.context} tokens ({self.batch_size * self.context})")
        count("log_every", 1, 10**7)
        count("eval_windows", 1, 4096)
        check_device(self.device, "device")

    @property
    def steps(self) -> int:
        return self.tokens // (self.batch_size * self.context)

    @property
    def shape(self) -> LMShape:
        return LMShape(vocab_size=data.VOCAB_SIZE, d_model=self.d_model, n_layers=self.n_layers,
                       n_heads=self.n_heads, context=self.context, attention=self.attention,
                       attention_args=dict(self.attention_args), positions=self.positions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_bytes(cfg: PretrainConfig) -> int:
    """The memory one run needs, estimated from its sizes: the weights with their gradients and
    AdamW's two moments, one step's activations kept for backward (per layer the scores and
    weights, the queries, keys, values and the MLP's hidden layer, several copies each) and the
    logits, and the corpus held as bytes."""
    b, t, d, n = cfg.batch_size, cfg.context, cfg.d_model, cfg.n_layers
    params = 6 * parameter_count(cfg.shape)
    per_layer = 6 * b * cfg.n_heads * t * t + 12 * b * t * d + 3 * b * t * 4 * d
    logits = 4 * b * t * data.VOCAB_SIZE
    evals = 4 * cfg.eval_windows * (n * cfg.n_heads * t * t + t * data.VOCAB_SIZE)
    return limits.RUN_BYTES + 4 * (params + n * per_layer + logits) + evals + 2 * 10**7


def check_memory(cfg: PretrainConfig, device: Any = None) -> None:
    limits.check_memory(run_bytes(cfg), f"a language model run ({cfg.attention} "
                        f"{cfg.n_layers}x{cfg.n_heads}, d_model {cfg.d_model}, context "
                        f"{cfg.context}, batch {cfg.batch_size})", device)


# ----------------------------------------------------------------------------- measuring


def measure(model: LanguageModel, windows: Tensor, batch_size: int = 16,
            edits: Hooks | None = None) -> dict[str, Any]:
    """The model on fixed windows (n, T): the mean next-token loss (nats per token) and, per
    layer and head, the first token's attention mass (``metrics.first_token_mass`` on the
    weights as the heads' outputs see them), the Gu et al. sink rate at eps = 0.3 (raw, and
    with each row divided by its sum for rules whose rows do not sum to 1), the first value's
    norm over the median of the others', and per layer the first token's residual-stream norm
    over the median of the others' (massive activations, leaving the layer). ``edits``: hooks
    applied to every pass (the model measured under an intervention)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    n_layers = model.shape.n_layers
    keep = [f"blocks.{layer}.{part}" for layer in range(n_layers)
            for part in ("attn.v", "resid_post")]
    sums: dict[str, Tensor] = {}
    loss_sum, loss_count, seen = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, windows.shape[0], batch_size):
            ids = windows[start:start + batch_size].to(device)
            hooks = Hooks(keep=keep) if edits is None else edits.merged(Hooks(keep=keep))
            out = model(ids, hooks=hooks, return_weights=True)
            losses = nn.functional.cross_entropy(
                out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float(),
                ids[:, 1:].reshape(-1), reduction="sum")
            loss_sum += float(losses)
            loss_count += ids[:, 1:].numel()
            weights = torch.stack(out.seen())  # (layers, B, H, T, T)
            n = ids.shape[0]
            values = {
                "first_mass": metrics.first_token_mass(weights),
                "sink_rate": metrics.sink_rate(weights, GU_EPS),
                "sink_rate_relative": metrics.sink_rate(weights, GU_EPS, relative=True),
                "value_ratio": torch.stack([_first_ratio(
                    hooks.cache[f"blocks.{layer}.attn.v"].norm(dim=-1), axis=1)
                    for layer in range(n_layers)]),  # (layers, H)
                "resid_ratio": torch.stack([_first_ratio(
                    hooks.cache[f"blocks.{layer}.resid_post"].norm(dim=-1)[..., None], axis=1)
                    for layer in range(n_layers)])[..., 0],  # (layers,)
            }
            for key, value in values.items():
                sums[key] = sums.get(key, 0) + value.double().cpu() * n
            seen += n
    model.train(was)
    out = {key: (value / seen).tolist() for key, value in sums.items()}
    out["val_loss"] = loss_sum / loss_count
    return out


def _first_ratio(norms: Tensor, axis: int) -> Tensor:
    """norms (B, T, ...) -> the first position's norm over the median of the others', mean over
    the batch: (...)."""
    first = norms.select(axis, 0)
    rest = norms.narrow(axis, 1, norms.shape[axis] - 1).median(dim=axis).values
    return (first / rest.clamp(min=1e-30)).mean(0)


# ------------------------------------------------------------------------------ training


def lr_at(cfg: PretrainConfig, step: int) -> float:
    """The rate at ``step``: linear warm-up over ``warmup`` steps, then a cosine to
    ``MIN_LR_SHARE`` of ``lr`` at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (MIN_LR_SHARE + (1 - MIN_LR_SHARE) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer(model: LanguageModel, cfg: PretrainConfig) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and ".rule." not in name else plain).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=BETAS)


def build(cfg: PretrainConfig, device: torch.device) -> LanguageModel:
    model = LanguageModel(cfg.shape)
    model.reset_parameters(torch.Generator().manual_seed(cfg.seed))
    return model.to(device)


def train(cfg: PretrainConfig, folder: Path, log: Callable[[str], None] = lambda _: None,
          split: data.Split | None = None) -> dict[str, Any]:
    """Train ``cfg`` in ``folder`` (created if missing), resuming from its checkpoint; the
    summary (also ``summary.json``). A folder with a summary is finished: it is read back."""
    folder = Path(folder)
    if (folder / SUMMARY).exists():
        return read_json(folder / SUMMARY)
    device = resolve_device(cfg.device, "device")
    check_memory(cfg, device)
    split = split or data.split(cfg.corpus, cfg.validation)
    windows = data.validation_windows(split.validation, cfg.eval_windows, cfg.context,
                                      cfg.fixed_first)
    folder.mkdir(parents=True, exist_ok=True)
    model = build(cfg, device)
    opt = optimizer(model, cfg)
    step, elapsed = 0, 0.0
    if (folder / CHECKPOINT).exists():
        state = torch.load(folder / CHECKPOINT, map_location=device, weights_only=True)
        if state["config"] != json.loads(json.dumps(cfg.to_dict())):
            raise ConfigError(f"{folder / CHECKPOINT} belongs to a run with other settings: "
                              "delete the folder to start this run afresh.")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
        log(f"pretrain: resumed {folder.name} at step {step} of {cfg.steps}")
    curve = _curve_until(folder / CURVE, step)
    model.train()
    started = time.perf_counter() - elapsed
    if step == 0 and not curve:
        curve.append(_point(model, windows, 0, cfg, 0.0, None))
        _write_curve(folder / CURVE, curve)
    train_loss = None
    while step < cfg.steps:
        ids = data.train_batch(split.train, cfg.batch_size, cfg.context, cfg.seed, step,
                               cfg.fixed_first).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits = model(ids).logits
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the training loss became {float(loss)} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        step += 1
        train_loss = loss.item()
        if step % cfg.log_every == 0 or step == cfg.steps:
            seconds = time.perf_counter() - started
            curve.append(_point(model, windows, step, cfg, seconds, train_loss))
            _write_curve(folder / CURVE, curve)
            _save(folder / CHECKPOINT, {"config": cfg.to_dict(), "model": model.state_dict(),
                                        "optimizer": opt.state_dict(), "step": step,
                                        "elapsed": seconds})
    seconds = time.perf_counter() - started
    _save(folder / MODEL, {"shape": cfg.shape.to_dict(), "model": model.state_dict()})
    summary = {"config": cfg.to_dict(), "steps": cfg.steps,
               "tokens": cfg.steps * cfg.batch_size * cfg.context,
               "parameters": parameter_count(cfg.shape), "seconds": seconds,
               "tokens_per_s": cfg.steps * cfg.batch_size * cfg.context / max(seconds, 1e-9),
               "device": device.type, "data": split.describe(), "final": curve[-1]}
    write_json(folder / SUMMARY, summary)
    (folder / CHECKPOINT).unlink(missing_ok=True)
    return summary


def _point(model: LanguageModel, windows: Tensor, step: int, cfg: PretrainConfig,
           seconds: float, train_loss: float | None) -> dict[str, Any]:
    return {"step": step, "tokens": step * cfg.batch_size * cfg.context, "seconds": seconds,
            "train_loss": train_loss, **measure(model, windows)}


def _curve_until(path: Path, step: int) -> list[dict[str, Any]]:
    """The curve's points up to ``step`` (a point written after the last checkpoint goes)."""
    if not path.exists():
        return []
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [p for p in points if p["step"] <= step]


def _write_curve(path: Path, curve: list[dict[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(p) + "\n" for p in curve).encode())


def _save(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_model(folder: Path, device: torch.device | str = "cpu") -> LanguageModel:
    """The trained model of a finished run's folder (``model.pt``)."""
    state = torch.load(Path(folder) / MODEL, map_location=device, weights_only=True)
    shape = LMShape(**state["shape"])
    model = LanguageModel(shape).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model
