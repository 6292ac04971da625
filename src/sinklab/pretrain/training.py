"""One pretraining run: its training loop, what it measures and logs, and how it resumes.

The run's settings are a ``PretrainConfig`` (``sinklab.pretrain.runconfig``); one that would not
fit in memory is refused before it starts (``check_memory``, from the estimate, never by
allocating).

``train(cfg, folder)`` trains with AdamW (betas 0.9 / 0.95, weight decay on the weight matrices
and embeddings, none on biases, norms and a rule's own parameters), a linear warm-up and then
the rate ``schedule`` (``lr_at``: a cosine decay to a tenth of the rate, constant, or
warm-up-stable-decay), gradients clipped at norm 1, the forward pass in float32 or under
bfloat16 autocast (``precision``). Every ``log_every`` steps (and
at step 0 and the last) it measures the model on the fixed validation windows (``measure``)
and appends one line to ``curve.jsonl``, then keeps a checkpoint (``checkpoint.pt``, written
atomically). A run stopped at any moment resumes from its last checkpoint: the batches are drawn
per step (``sinklab.pretrain.data``), so the resumed run is the run that was not stopped. When
it ends it writes ``model.pt`` (the weights and the shape, what the interventions load) and
``summary.json`` (the last measurement, the time and the speed; ``status`` ``finished``, or
``diverged`` when the training loss stopped being finite, which ends the run there and keeps no
model), removes the checkpoint and
seals the folder (``sinklab.runs.folders.seal``: a run with a completion record is finished);
``config.json`` holds the settings from the start. A folder that is not a sinklab run folder is
refused in one sentence.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sinklab import metrics
from sinklab.definitions import GU_EPS
from sinklab.errors import ConfigError
from sinklab.hooks import Hooks
from sinklab.lm import edits
from sinklab.pretrain import data
from sinklab.pretrain.network import LanguageModel, LMShape, parameter_count
from sinklab.pretrain.runconfig import (
    ABLATE_HEADS,
    CAP_EPS,
    KIND,
    WINDOW,
    PretrainConfig,
    check_memory,
)
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_atomic, write_json
from sinklab.train import resolve_device

CONFIG = "config.json"
INTERVENTIONS = "interventions.json"
CURVE = "curve.jsonl"
CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
SUMMARY = "summary.json"
BETAS = (0.9, 0.95)
MIN_LR_SHARE = 0.1  # the cosine and wsd's decay end at this share of the rate
CLIP = 1.0


def shape(cfg: PretrainConfig) -> LMShape:
    m = cfg.model
    return LMShape(vocab_size=data.VOCAB_SIZE, d_model=m.d_model, n_layers=m.n_layers,
                   n_heads=m.n_heads, context=m.context, attention=m.attention,
                   attention_args=dict(m.attention_args), positions=m.positions,
                   init_std=m.init_std)


# ----------------------------------------------------------------------------- measuring


def _passes(model: LanguageModel, windows: Tensor, batch_size: int,
            edits: Hooks | None = None) -> Iterator[tuple[Tensor, Any, Hooks]]:
    """Each batch of fixed windows (n, T) through the model in evaluation mode without
    gradients, with every layer's values and the hidden states leaving it kept (and ``edits``
    applied to every pass): (ids, the forward pass with its weights, the hooks holding them).
    The model's training mode comes back afterwards."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    keep = [f"blocks.{layer}.{part}" for layer in range(model.shape.n_layers)
            for part in ("attn.v", "resid_post")]
    try:
        with torch.no_grad():
            for start in range(0, windows.shape[0], batch_size):
                ids = windows[start:start + batch_size].to(device)
                hooks = Hooks(keep=keep) if edits is None else edits.merged(Hooks(keep=keep))
                yield ids, model(ids, hooks=hooks, return_weights=True), hooks
    finally:
        model.train(was)


def measure(model: LanguageModel, windows: Tensor, batch_size: int = 16,
            edits: Hooks | None = None) -> dict[str, Any]:
    """The model on fixed windows (n, T): the mean next-token loss (nats per token) and, per
    layer and head, the first token's attention mass (``metrics.first_token_mass`` on the
    weights as the heads' outputs see them), the Gu et al. sink rate at eps = 0.3 (raw, and
    with each row divided by its sum for rules whose rows do not sum to 1), the first value's
    norm over the median of the others', and per layer the first token's residual-stream norm
    over the median of the others' (massive activations, leaving the layer). ``edits``: hooks
    applied to every pass (the model measured under an intervention)."""
    n_layers = model.shape.n_layers
    sums: dict[str, Tensor] = {}
    loss_sum, loss_count, seen = 0.0, 0, 0
    for ids, out, hooks in _passes(model, windows, batch_size, edits):
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
    result = {key: (value / seen).tolist() for key, value in sums.items()}
    result["val_loss"] = loss_sum / loss_count
    return result


def field_measure(model: LanguageModel, windows: Tensor, batch_size: int = 16) -> dict[str, Any]:
    """The model measured the way the field measures (``sinklab.metrics``' field section), on
    fixed windows (n, T): Gu et al.'s first-key importance on the first ``GU_FIRST`` tokens of
    each window, raw and with each row divided by its sum, per layer, head and window, and the
    sink rate over (window, layer, head) at each eps of ``EPS_GRID``; per layer, each head's
    rate at eps = 0.3, Sun et al.'s massive activations in the hidden states leaving the layer,
    the first token's residual norm over the median of the others' and each head's first value
    norm over the others'."""
    n_layers = model.shape.n_layers
    a0, a0_rel, hidden, values = [], [], [[] for _ in range(n_layers)], []
    for ids, out, hooks in _passes(model, windows, batch_size):
        weights = torch.stack(out.seen())
        a0.append(metrics.first_importance(weights).cpu())  # (layers, B, H)
        a0_rel.append(metrics.first_importance(weights, relative=True).cpu())
        for layer in range(n_layers):
            hidden[layer].append(hooks.cache[f"blocks.{layer}.resid_post"].float().cpu())
        values.append(torch.stack([_first_ratio(
            hooks.cache[f"blocks.{layer}.attn.v"].norm(dim=-1), axis=1)
            for layer in range(n_layers)]).cpu() * ids.shape[0])  # (layers, H)
    raw, rel = torch.cat(a0, dim=1), torch.cat(a0_rel, dim=1)  # (layers, n, H)
    layers = []
    for layer in range(n_layers):
        states = torch.cat(hidden[layer])  # (n, T, d)
        norms = states.norm(dim=-1)
        layers.append({
            "head_rates": (raw[layer] > GU_EPS).double().mean(0).tolist(),
            "massive": metrics.massive_activations(states),
            "resid_ratio": float((norms[:, 0] / norms[:, 1:].median(dim=1).values).mean()),
            "value_ratio": (sum(v[layer] for v in values) / windows.shape[0]).tolist()})
    return {"first": metrics.GU_FIRST, "windows": int(windows.shape[0]),
            "eps_grid": list(metrics.EPS_GRID), "rates": metrics.rates_over_eps(raw),
            "rates_relative": metrics.rates_over_eps(rel),
            "a0": raw.permute(0, 2, 1).tolist(), "a0_relative": rel.permute(0, 2, 1).tolist(),
            "layers": layers}


def _first_ratio(norms: Tensor, axis: int) -> Tensor:
    """norms (B, T, ...) -> the first position's norm over the median of the others', mean over
    the batch: (...)."""
    first = norms.select(axis, 0)
    rest = norms.narrow(axis, 1, norms.shape[axis] - 1).median(dim=axis).values
    return (first / rest.clamp(min=1e-30)).mean(0)


# ------------------------------------------------------------------------------ training


def lr_at(cfg: PretrainConfig, step: int) -> float:
    """The rate at ``step``: a linear warm-up over ``warmup`` steps, then by ``schedule``: a
    cosine to ``MIN_LR_SHARE`` of ``lr`` at the last step; ``lr`` held to the end (a run read
    at its checkpoints is then the run of every shorter budget); or ``lr`` held until the last
    ``decay_share`` of the steps, then a linear decay to ``MIN_LR_SHARE`` of it at the last
    step (warm-up-stable-decay)."""
    t = cfg.train
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    if t.schedule == "constant":
        return t.lr
    if t.schedule == "wsd":
        decay = max(1, round(cfg.steps * t.decay_share))
        start = max(t.warmup, cfg.steps - decay)
        progress = min(1.0, max(0, step - start) / max(1, cfg.steps - start))
        return t.lr * (1 - (1 - MIN_LR_SHARE) * progress)
    span = max(1, cfg.steps - t.warmup)
    progress = min(1.0, (step - t.warmup) / span)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return t.lr * (MIN_LR_SHARE + (1 - MIN_LR_SHARE) * cosine)


def optimizer(model: LanguageModel, cfg: PretrainConfig) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and ".rule." not in name else plain).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.train.weight_decay},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=cfg.train.lr, betas=BETAS)


def autocast(cfg: PretrainConfig, device: torch.device) -> Any:
    """The training forward pass's precision: bfloat16 autocast over float32 weights where
    ``precision`` asks for it (the loss, the backward's accumulation into float32 gradients, the
    optimiser and every measurement stay float32), else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16,
                          enabled=cfg.train.precision == "bfloat16")


def build(cfg: PretrainConfig, device: torch.device) -> LanguageModel:
    model = LanguageModel(shape(cfg))
    model.reset_parameters(torch.Generator().manual_seed(cfg.train.seed))
    return model.to(device)


def train(cfg: PretrainConfig, folder: Path, log: Callable[[str], None] = lambda _: None,
          split: data.Split | None = None,
          on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``cfg`` in ``folder`` (created if missing), resuming from its checkpoint; the
    summary (also ``summary.json``). A folder with a summary is finished: it is read back.
    ``on_point`` is handed each logged point as it is written (the points before a resumption
    first), for a person watching."""
    folder = Path(folder)
    if folders.check_complete(folder):
        return read_json(folder / SUMMARY)
    # not its parents: a study's workers train inside the folder its driver holds
    folders.check_writable(folder, "run", option="run folder", ancestors=False)
    device = resolve_device(cfg.train.device, "train.device")
    check_memory(cfg, device=device)
    split = split or data.split(cfg.data.corpus, cfg.data.validation)
    windows = data.validation_windows(split.validation, cfg.data.eval_windows, cfg.model.context,
                                      cfg.data.fixed_first)
    folder.mkdir(parents=True, exist_ok=True)
    if folders.read_marker(folder) is None:
        folders.mark(folder, "run")
    write_json(folder / CONFIG, cfg.to_dict())
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
    for point in curve if on_point else ():
        on_point(point)
    train_loss = None
    diverged: int | None = None
    while step < cfg.steps:
        ids = data.train_batch(split.train, cfg.train.batch_size, cfg.model.context, cfg.train.seed,
                               step, cfg.data.fixed_first).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        with autocast(cfg, device):
            logits = model(ids).logits
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                           ids[:, 1:].reshape(-1))
        if not torch.isfinite(loss):  # diverged: the run ends here, recorded as such
            diverged = step
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        step += 1
        train_loss = loss.item()
        if step % cfg.train.log_every == 0 or step == cfg.steps:
            seconds = time.perf_counter() - started
            curve.append(_point(model, windows, step, cfg, seconds, train_loss))
            _write_curve(folder / CURVE, curve)
            if on_point:
                on_point(curve[-1])
            _save(folder / CHECKPOINT, {"config": cfg.to_dict(), "model": model.state_dict(),
                                        "optimizer": opt.state_dict(), "step": step,
                                        "elapsed": seconds})
    seconds = time.perf_counter() - started
    effects = None
    if diverged is not None:  # no model worth measuring or keeping: its weights are not finite
        return _finish(folder, cfg, split, device, curve, seconds, step, None, diverged)
    if cfg.data.probe_windows:
        probes = data.validation_windows(split.validation, cfg.data.probe_windows,
                                         cfg.model.context, cfg.data.fixed_first)
        full = intervene(model, probes, folder.name)
        write_json(folder / INTERVENTIONS, full)
        effects = intervention_summary(full)
    _save(folder / MODEL, {"shape": shape(cfg).to_dict(), "model": model.state_dict()})
    return _finish(folder, cfg, split, device, curve, seconds, step, effects, None)


def _finish(folder: Path, cfg: PretrainConfig, split: data.Split, device: torch.device,
            curve: list[dict[str, Any]], seconds: float, step: int,
            effects: dict[str, Any] | None, diverged: int | None) -> dict[str, Any]:
    """Write the summary, remove the checkpoint and seal the folder. A run that diverged
    (``status`` ``diverged``, at step ``diverged_step``) keeps its curve up to its last
    measurement, which ``final`` repeats, and has no model."""
    per_step = cfg.train.batch_size * cfg.model.context
    summary = {"kind": KIND, "seed": cfg.train.seed, "attention": cfg.model.attention,
               "status": "finished" if diverged is None else "diverged",
               "diverged_step": diverged, "config": cfg.to_dict(), "steps": step,
               "tokens": step * per_step,
               "parameters": parameter_count(shape(cfg)), "wall_time_s": seconds,
               "tokens_per_s": step * per_step / max(seconds, 1e-9),
               "device": device.type, "data": split.describe(), "final": curve[-1],
               "interventions": effects}
    write_json(folder / SUMMARY, summary)
    (folder / CHECKPOINT).unlink(missing_ok=True)
    folders.seal(folder)  # last: the run is finished once its record is written
    return read_json(folder / SUMMARY)


# ------------------------------------------------------------------------- interventions

@dataclass(frozen=True)
class _Source:
    name: str


@dataclass(frozen=True)
class _Loaded:
    """What ``sinklab.lm.edits.run_causal`` reads of a loaded model."""

    model: LanguageModel
    n_layers: int
    n_heads: int
    device: torch.device
    source: _Source


def intervene(model: LanguageModel, probes: Tensor, name: str = "model") -> dict[str, Any]:
    """The interventions of ``sinklab lm`` (``sinklab.lm.edits.run_causal``, the same code as
    on a real model) on windows of validation text (n, T): the first key hidden, its value
    zeroed, its mass capped at 1 - ``CAP_EPS``, each beside its control on a random other key;
    StreamingLLM's cache of ``WINDOW`` recent tokens with 0, 1 and 4 first tokens kept or a
    random old one; every head ablated alone (zero, mean, first-key cap). The next-token loss
    change per probe of each."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    shape = model.shape
    heads = min(ABLATE_HEADS, shape.n_layers * shape.n_heads // 2)
    settings = edits.Settings(n_probes=probes.shape[0], n_heads=heads, cap_eps=CAP_EPS,
                              window=WINDOW, batch_size=16)
    loaded = _Loaded(model, shape.n_layers, shape.n_heads, device, _Source(name))
    try:
        out = edits.run_causal(loaded, probes, torch.ones_like(probes), settings, [],
                               lambda _: None)
    finally:
        model.train(was)
    return {**out, "cap_eps": CAP_EPS, "window": WINDOW}


def _mean_of(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else None


def intervention_summary(full: dict[str, Any]) -> dict[str, Any]:
    """The numbers a study reads of ``intervene``'s record: each global edit's mean loss change
    over the probes and its control's; StreamingLLM's; the cost of evicting the first token
    (no first token kept beside the window, minus the first kept), per probe and its mean; the
    mean loss change of zeroing one of the sink heads, and one of the other heads."""
    out: dict[str, Any] = {}
    for edit in full["global"]:
        out[edit["key"]] = _mean_of(edit["per_probe"])
        out[edit["key"] + "_control"] = _mean_of(edit["control"]["per_probe"])
    streams = {s["k"]: s["per_probe"] for s in full["streaming"]}
    for k, values in streams.items():
        out[f"streaming_{k}"] = _mean_of(values)
    if 0 in streams and 1 in streams:
        cost = [a - b for a, b in zip(streams[0], streams[1])]
        out["eviction_cost"] = _mean_of(cost)
        out["eviction_cost_per_probe"] = cost
    sinks = {tuple(h) for h in full["sink_heads"]}
    zero = {(h["layer"], h["head"]): _mean_of(h["zero"]) for h in full["heads"]}
    out["sink_heads"] = [list(h) for h in sorted(sinks)]
    out["sink_heads_zero"] = _mean_of([v for h, v in zero.items() if h in sinks])
    out["other_heads_zero"] = _mean_of([v for h, v in zero.items() if h not in sinks])
    return out


def _point(model: LanguageModel, windows: Tensor, step: int, cfg: PretrainConfig,
           seconds: float, train_loss: float | None) -> dict[str, Any]:
    return {"step": step, "tokens": step * cfg.train.batch_size * cfg.model.context,
            "seconds": seconds,
            "train_loss": train_loss, **measure(model, windows)}


def read_curve(folder: Path) -> list[dict[str, Any]]:
    """A run's logged points (``curve.jsonl``), as far as they go."""
    return _curve_until(Path(folder) / CURVE, 10**18)


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
