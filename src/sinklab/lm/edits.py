"""The interventions of ``sinklab lm``: the paper's story tested in a real model by editing it.

The paper's story is that a sink is how softmax attention does nothing: a head that must output
zero parks its weight on a token whose value is (near) zero. For a causal LM this module reads,
per (layer, head), the first token's attention mass, the norm of the first token's value vector
against the other tokens' (Guo et al.'s value-state drain) and the norm of the head's output
at each query, all from one hooked pass (``sinklab.lm.capture``), and it measures by the
next-token loss what happens when the model is edited (``sinklab.lm.interventions``):

- every layer at once: the first key hidden from every query, the first value zeroed, the first
  key's mass capped at 1 - eps, and StreamingLLM's cache (the first k tokens plus a window);
- one head at a time, for the heads with the most first-token mass and a random control set of
  the same size: zero ablation, mean ablation and capping its first-token mass;
- the trigger-conditional heads the finder keeps: zero ablation, the loss change at their trigger
  tokens against elsewhere.

Every number is per probe, so that intervals resample probes. A head ablation reruns only the
layers from the head's own one on, from the residual stream cached in the baseline pass. An
encoder has no next-token loss: for it the global edits are measured by the relative change of
the final hidden states.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from sinklab import claims as cl
from sinklab import metrics
from sinklab.hooks import Hooks
from sinklab.lm import capture
from sinklab.lm import interventions as iv
from sinklab.lm import loading as lm
from sinklab.lm import trigger_heads

SINK_TOKENS = (0, 1, 4)  # StreamingLLM's k: the first k tokens kept beside the window
HARMLESS = 0.01  # nats per token: a change of the mean loss smaller than this is "harmless"
CONTROL_SEED = 0  # the random control heads' draw
TARGETED_HEADS = 6  # at most this many of the finder's heads get the targeted ablation
LOSS_TOKENS = 2  # a next-token loss needs a token to predict from and one to predict


def compared_from(window: int) -> int:
    """The first query where even the largest k's StreamingLLM cache has dropped keys
    (``interventions.streaming_positions``: from k + window on): the StreamingLLM rows compare
    the loss from there on."""
    return window + max(SINK_TOKENS)


def streaming_tokens(window: int) -> int:
    """The tokens a probe needs (special tokens included) for a StreamingLLM row to compare
    any loss: a loss at query t needs t + ``LOSS_TOKENS`` of them."""
    return compared_from(window) + LOSS_TOKENS


@dataclass(frozen=True)
class Settings:
    """What the interventions depend on (the study's options, as numbers)."""

    n_probes: int  # natural probes the interventions run on (the first ones)
    n_heads: int  # heads ablated one at a time, and as many random control heads
    cap_eps: float  # caps leave each row at most 1 - cap_eps on the first key
    window: int  # StreamingLLM's recent-token window
    batch_size: int


class Stages(Protocol):
    """Where finished stages are kept (``studies.base.Stages``): ``keep(name, compute)`` gives
    the stage's kept result, or computes it and keeps it, returned as it will be read back."""

    def keep(self, name: str, compute: Callable[[], Any]) -> Any: ...


class Unkept:
    """Stages kept nowhere: every stage is computed."""

    def keep(self, name: str, compute: Callable[[], Any]) -> Any:
        return compute()


def batches(ids: Tensor, mask: Tensor, size: int) -> Iterator[tuple[Tensor, Tensor]]:
    for start in range(0, ids.shape[0], size):
        yield ids[start:start + size], mask[start:start + size]


def nan_mean(values: np.ndarray, axis: int) -> np.ndarray:
    """The mean over ``axis`` of the finite entries (nan where there are none), without
    numpy's warning for an empty slice."""
    ok = np.isfinite(values)
    count = ok.sum(axis)
    total = np.where(ok, values, 0.0).sum(axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def masked_mean(values: Tensor, where: Tensor, dim: int) -> list[float]:
    """The mean of ``values`` (B, P) over the entries ``where`` (B, P) selects, along ``dim``
    (nan where a row or column has none)."""
    total = torch.where(where, values, 0.0).sum(dim)
    count = where.sum(dim)
    return (total / count).where(count > 0, torch.nan).tolist()


def per_probe(values: Tensor, where: Tensor) -> list[float]:
    """Each probe's mean of ``values`` (B, P) over its positions that ``where`` selects."""
    return masked_mean(values, where, -1)


def measured(values: Tensor, where: Tensor) -> dict[str, Any]:
    """An edit's change per probe (``per_probe``) and what it rests on: the probes with a
    position measured, and the positions."""
    kept = per_probe(values, where)
    return {"per_probe": kept, "n_probes": sum(v == v for v in kept),
            "n_positions": int(where.sum())}


def per_position(values: Tensor, where: Tensor) -> list[float]:
    """Each position's mean of ``values`` (B, P) over the probes that ``where`` selects."""
    return masked_mean(values, where, 0)


# ------------------------------------------------------------------ per-head statistics


class HeadStats:
    """Running per-probe sums, per (layer, head), filled by hooks during one forward pass:
    first-token mass over the queries that see another key, the first value's norm over the
    mean norm of the others, and the mean norm of the head's output over real queries."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.first: list[list[Tensor]] = [[] for _ in range(n_layers)]
        self.value: list[list[Tensor]] = [[] for _ in range(n_layers)]
        self.output: list[list[Tensor]] = [[] for _ in range(n_layers)]
        self.mean_sum: dict[int, Tensor] = {}  # layer -> (H, d_model) summed result
        self.mean_count = 0
        self.valid: Tensor | None = None  # (B, T) of the batch running

    def hooks(self, causal: bool) -> dict[str, Any]:
        edits: dict[str, Any] = {}
        for layer in range(self.n_layers):
            edits[f"blocks.{layer}.attn.pattern"] = self._pattern(layer, causal)
            edits[f"blocks.{layer}.attn.v"] = self._value(layer)
            edits[f"blocks.{layer}.attn.result"] = self._result(layer)
        return edits

    def _pattern(self, layer: int, causal: bool) -> Callable[[Tensor, str], None]:
        def hook(pattern: Tensor, name: str) -> None:  # (B, H, Q, K)
            # each probe as a batch of one, so that the metric keeps the probes apart
            mass = metrics.first_token_mass(pattern[:, None].float(), causal,
                                            valid=self.valid[:, None])  # (B, H)
            self.first[layer].append(mass.cpu())
        return hook

    def _value(self, layer: int) -> Callable[[Tensor, str], None]:
        def hook(v: Tensor, name: str) -> None:  # (B, K, H, d_head)
            norms = v.float().norm(dim=-1)  # (B, K, H)
            keys = self.valid.clone()  # the real keys after the first
            keys[:, 0] = False
            w = keys[..., None].to(norms.dtype)
            others = (norms * w).sum(1) / w.sum(1).clamp(min=1)  # (B, H)
            ratio = norms[:, 0] / others.clamp(min=1e-12)
            # a probe of one token has no other value to compare with: not measured
            self.value[layer].append(ratio.where(w.sum(1) > 0, torch.nan).cpu())
        return hook

    def _result(self, layer: int) -> Callable[[Tensor, str], None]:
        def hook(result: Tensor, name: str) -> None:  # (B, Q, H, d_model)
            w = self.valid[..., None].to(result.dtype)  # (B, Q, 1)
            norms = result.float().norm(dim=-1)  # (B, Q, H)
            self.output[layer].append(((norms * w).sum(1) / w.sum(1).clamp(min=1)).cpu())
            summed = (result * w[..., None]).sum(dim=(0, 1))  # (H, d_model)
            self.mean_sum[layer] = self.mean_sum.get(layer, 0) + summed
            if layer == 0:
                self.mean_count += int(self.valid.sum())
        return hook

    def means(self) -> dict[int, Tensor]:
        """Each layer's mean head result over every real position: (H, d_model)."""
        return {layer: s / max(self.mean_count, 1) for layer, s in self.mean_sum.items()}

    def arrays(self) -> dict[str, np.ndarray]:
        """(probes, layers, heads) each."""
        def stack(parts: list[list[Tensor]]) -> np.ndarray:
            return torch.stack([torch.cat(p) for p in parts], dim=1).numpy()
        return {"first": stack(self.first), "value_ratio": stack(self.value),
                "output_norm": stack(self.output)}


# ---------------------------------------------------------------------------- the runs


def _global_edits(cap_eps: float, n_layers: int) -> list[tuple[str, str, Hooks]]:
    """The edits made at every layer and head at once: (key, label, hooks)."""
    return [
        ("hide_first_key", "the first key hidden from every query (softmax renormalised)",
         iv.hide_first_key(n_layers)),
        ("zero_first_value", "the first token's value zeroed in every head",
         iv.zero_first_value(n_layers)),
        ("cap_first_mass", f"the first key's mass capped at 1 - {cap_eps:g} in every head",
         iv.cap_first_mass(cap_eps, n_layers)),
    ]


def choose_heads(first: np.ndarray, n: int, seed: int = CONTROL_SEED
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The ``n`` heads with the most first-token mass (``first`` (layers, heads), mean over
    probes), and ``n`` others drawn at random (seeded) as the control set."""
    heads = first.shape[1]
    order = np.argsort(-np.nan_to_num(first, nan=-1.0), axis=None, kind="stable")
    n = min(n, first.size // 2)
    flagged = [divmod(int(i), heads) for i in order[:n]]
    rest = order[n:]
    rng = np.random.default_rng(seed)
    control = [divmod(int(i), heads) for i in np.sort(rng.choice(rest, size=n, replace=False))]
    return flagged, control


def run_causal(loaded: lm.LoadedModel, ids: Tensor, mask: Tensor, settings: Settings,
               triggers: list[dict[str, Any]], log: Callable[[str], None],
               stages: Stages | None = None) -> dict[str, Any]:
    """Every intervention on a causal LM; ``ids``/``mask`` (probes, T) padded on the right,
    ``triggers`` the finder's heads (layer, head, token ids). Each stage (the head statistics,
    the global edits, each ablated head, each targeted head) is kept in ``stages`` as it
    finishes, and a stage kept there is not computed again; the baseline pass runs every time
    (the ablations restart from the residual stream it caches)."""
    stages = stages or Unkept()
    start = time.perf_counter()
    model = loaded.model
    n_layers = loaded.n_layers
    size = settings.batch_size
    stats = HeadStats(n_layers)
    keep = [f"blocks.{layer}.resid_pre" for layer in range(n_layers)]
    base, resid = [], []  # per batch: losses (B, T-1), {layer: resid_pre}
    for b_ids, b_mask in batches(ids, mask, size):
        stats.valid = b_mask.bool().to(loaded.device)
        hooks = Hooks(stats.hooks(causal=True), keep=keep)
        base.append(iv.token_losses(model, b_ids, b_mask, hooks=hooks))
        resid.append({int(n.split(".")[1]): t for n, t in hooks.cache.items()})
    baseline = torch.cat(base)
    scored = ~baseline.isnan()
    log(f"lm: {loaded.source.name}: interventions: baseline and head statistics "
        f"({time.perf_counter() - start:.0f} s)")
    means = stats.means()
    heads = stages.keep("head_stats",
                        lambda: {k: v.tolist() for k, v in stats.arrays().items()})

    def change(hooks: Hooks, layer: int | None = None) -> Tensor:
        """Loss change per position (probes, T-1), rerunning from ``layer`` when given."""
        parts = []
        for i, (b_ids, b_mask) in enumerate(batches(ids, mask, size)):
            if layer is None:
                parts.append(iv.token_losses(model, b_ids, b_mask, hooks=hooks))
            else:
                parts.append(iv.losses_from_layer(model, resid[i][layer], layer, b_ids, b_mask,
                                                  hooks=hooks))
        return torch.cat(parts) - baseline

    compared = compared_from(settings.window)  # loss index t is query t
    where = scored.clone()
    where[:, :compared] = False

    def global_edits() -> dict[str, Any]:
        edits = []
        for key, label, hooks in _global_edits(settings.cap_eps, n_layers):
            delta = change(hooks)
            edits.append({"key": key, "label": label, **measured(delta, scored),
                          "per_position": per_position(delta, scored)})
        streams = []
        for k in SINK_TOKENS if bool(where.any()) else ():  # some loss position is compared
            delta = change(iv.streaming(k, settings.window, n_layers))
            streams.append({"k": k, **measured(delta, where),
                            "per_position": per_position(delta, scored)})
        return {"global": edits, "streaming": streams}

    kept = stages.keep("global", global_edits)
    log(f"lm: {loaded.source.name}: interventions: global edits and streaming "
        f"({time.perf_counter() - start:.0f} s)")
    out: dict[str, Any] = {"baseline": per_probe(baseline, scored), **kept, "heads": [],
                           "targeted": [], "n_positions": int(scored.sum()),
                           "n_scored_probes": int(scored.any(1).sum())}
    flagged, control = choose_heads(nan_mean(np.asarray(heads["first"], dtype=float), 0),
                                    settings.n_heads)
    def ablated(group: str, layer: int, head: int) -> dict[str, Any]:
        row: dict[str, Any] = {"layer": layer, "head": head, "group": group}
        for how, hooks in (("zero", iv.ablate_heads([(layer, head)], "zero")),
                           ("mean", iv.ablate_heads([(layer, head)], "mean",
                                                    {(layer, head): means[layer][head]})),
                           ("cap", iv.cap_first_mass(settings.cap_eps, n_layers,
                                                     layers=[layer], heads=[head]))):
            row[how] = per_probe(change(hooks, layer), scored)
        return row

    for group, chosen in (("flagged", flagged), ("control", control)):
        for layer, head in chosen:
            out["heads"].append(stages.keep(f"head {group} {layer} {head}",
                                            lambda group=group, layer=layer, head=head:
                                            ablated(group, layer, head)))
    log(f"lm: {loaded.source.name}: interventions: {len(out['heads'])} heads ablated "
        f"({time.perf_counter() - start:.0f} s)")
    def targeted(found: dict[str, Any]) -> dict[str, Any]:
        layer, head = found["layer"], found["head"]
        delta = change(iv.ablate_heads([(layer, head)], "zero"), layer)
        tokens = torch.tensor([t["id"] for t in found["tokens"]])
        is_trigger = torch.isin(ids[:, :-1], tokens) & scored
        effect = trigger_heads.targeted_effect(delta.nan_to_num().numpy(),
                                               is_trigger.numpy(), scored.numpy())
        return {"layer": layer, "head": head, "tokens": [t["token"] for t in found["tokens"]],
                "summary": effect}

    for found in triggers[:TARGETED_HEADS]:
        out["targeted"].append(stages.keep(f"targeted {found['layer']} {found['head']}",
                                           lambda found=found: targeted(found)))
    out.update({"head_stats": heads, "flagged": flagged, "control": control,
                "compared_from": compared, "streaming_needs": streaming_tokens(settings.window),
                "seconds": time.perf_counter() - start})
    return out


def run_encoder(loaded: lm.LoadedModel, ids: Tensor, mask: Tensor, settings: Settings
                ) -> dict[str, Any]:
    """The global edits on an encoder, measured by the relative change of the final hidden
    states (an encoder has no next-token loss)."""
    start = time.perf_counter()
    out: dict[str, Any] = {"global": []}
    for key, label, hooks in _global_edits(settings.cap_eps, loaded.n_layers):
        parts, valid = [], []
        for b_ids, b_mask in batches(ids, mask, settings.batch_size):
            parts.append(iv.hidden_change(loaded.model, b_ids, b_mask, hooks=hooks))
            valid.append(b_mask.bool())
        delta, where = torch.cat(parts), torch.cat(valid)
        out["global"].append({"key": key, "label": label, **measured(delta, where)})
    out["seconds"] = time.perf_counter() - start
    return out


def supported(loaded: lm.LoadedModel) -> str | None:
    """Why the interventions cannot run on this model, or None when they can."""
    family = capture.supported(loaded.model)
    if family is None:
        return (f"{type(loaded.model).__name__} is not an architecture sinklab's hooks attach "
                f"to ({capture.SUPPORTED_TEXT}), so no intervention was made.")
    return None


# ------------------------------------------------------------------------------- claims

PROBES = ("probe", "probes")


def needs_text(tokens: int, prefix: list[str]) -> str:
    """What a measurement without data needs, in a user's terms: texts of at least N tokens,
    and how many that is with the special tokens put in front (``prefix``, their names)."""
    content = max(tokens - len(prefix), 1)
    front = f" ({tokens} with {' '.join(prefix)} in front)" if prefix else ""
    return f"not measured: needs texts of at least {content} token{'' if content == 1 else 's'}" \
        f"{front}"


def _finite(values: list[float | None]) -> list[float]:
    """The measured values: a probe with no position measured is nan, or None once the records
    have been through JSON."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _group_mean(rows: list[dict[str, Any]], group: str, how: str) -> list[float]:
    """Per probe, the mean over a group's heads of one ablation's loss change."""
    chosen = [r[how] for r in rows if r["group"] == group]
    return nan_mean(np.asarray(chosen, dtype=float), 0).tolist() if chosen else []


def _heads_value(stats: dict[str, list], key: str, heads: list) -> np.ndarray:
    """(probes, len(heads)) of a per-head statistic."""
    arr = np.asarray(stats[key], dtype=float)
    return np.stack([arr[:, layer, head] for layer, head in heads], axis=1)


def _claim(build: Callable[..., cl.Claim], key: str, sentence: str, values: list[Any],
           *args: Any, what: str, missing: str) -> cl.Claim:
    """``build``'s claim over the measured ``values``; with none, an undetermined claim that
    says why (``missing``: what the measurement needs)."""
    kept = _finite(values)
    short = len(values) - len(kept)
    if kept and short:  # k of n: the probes too short for it are named
        why = missing.removeprefix("not measured: ")
        what += f" ({short} of the {len(values)} too short to measure: {why})"
    claim = build(key, sentence, kept, *args, PROBES, what)
    if kept:
        return claim
    return dataclasses.replace(claim, data=f"{what}; {missing}", needed_text=missing)


def claims(model: dict[str, Any]) -> list[cl.Claim]:
    """The story's claims for one causal model's interventions (``model["interventions"]``);
    a claim whose measurement has no probe says what it needs."""
    iv_rec = model["interventions"]
    key, name = model["key"], model["model"]
    n = len(iv_rec["baseline"])
    what = f"over {n} natural probes"
    prefix = iv_rec.get("prefix", [])
    loss = needs_text(LOSS_TOKENS, prefix)
    out = []
    by_key = {g["key"]: g for g in iv_rec["global"]}
    out.append(_claim(
        cl.mean_at_least, f"{key}.hide_first_key_raises_loss",
        f"{name}: hiding the first token's key from every query raises the next-token loss",
        by_key["hide_first_key"]["per_probe"], 0.0,
        what=f"each probe's mean loss change (nats per token) {what}", missing=loss))
    out.append(_claim(
        cl.mean_within, f"{key}.zero_first_value_harmless",
        f"{name}: zeroing the first token's value in every head changes the loss by less than "
        f"{HARMLESS:g} nats per token (its value is near zero, so the sink adds nothing)",
        by_key["zero_first_value"]["per_probe"], 0.0, HARMLESS,
        what=f"each probe's mean loss change {what}", missing=loss))
    out.append(_claim(
        cl.mean_at_least, f"{key}.cap_first_mass_raises_loss",
        f"{name}: capping every head's first-token mass at 1 - {iv_rec['cap_eps']:g} raises the "
        f"loss", by_key["cap_first_mass"]["per_probe"], 0.0,
        what=f"each probe's mean loss change {what}", missing=loss))
    streams = {s["k"]: s for s in iv_rec["streaming"]}
    gain = (np.asarray(streams[0]["per_probe"], dtype=float)
            - np.asarray(streams[1]["per_probe"], dtype=float)).tolist() if streams else []
    out.append(_claim(
        cl.mean_at_least, f"{key}.streaming_first_token_helps",
        f"{name}: with a window of {iv_rec['window']} recent tokens, also keeping the first "
        f"token lowers the loss (StreamingLLM's finding)", gain, 0.0,
        what=f"each probe's loss with k = 0 minus with k = 1, at positions >= "
             f"{iv_rec['compared_from']} {what}",
        missing=needs_text(iv_rec["streaming_needs"], prefix)))
    rows = iv_rec["heads"]
    flagged, control = iv_rec["flagged"], iv_rec["control"]
    stats = iv_rec["head_stats"]
    out_f = nan_mean(_heads_value(stats, "output_norm", flagged), 1)
    out_c = nan_mean(_heads_value(stats, "output_norm", control), 1)
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_output_small",
        f"{name}: the {len(flagged)} heads with the most first-token mass write outputs at most "
        f"half as large as {len(control)} random other heads (they do little)",
        (out_f / out_c).tolist(), 0.5,
        what="each probe's mean output norm of the sink heads over that of the control heads",
        missing=needs_text(1, prefix)))
    ratio = nan_mean(_heads_value(stats, "value_ratio", flagged), 1)
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_value_drained",
        f"{name}: in the sink heads the first token's value vector is shorter than the other "
        f"tokens' (Guo et al.'s value-state drain)", ratio.tolist(), 1.0,
        what="each probe's mean, over the sink heads, of the first value's norm over the mean "
             "norm of the other values", missing=needs_text(2, prefix)))
    for how, words in (("zero", "zero-ablating"), ("mean", "mean-ablating")):
        out.append(_claim(
            cl.mean_within, f"{key}.sink_heads_{how}_ablation_harmless",
            f"{name}: {words} one sink head changes the loss by less than {HARMLESS:g} nats "
            f"per token (the head does nothing)", _group_mean(rows, "flagged", how),
            0.0, HARMLESS,
            what=f"each probe's loss change, averaged over the {len(flagged)} sink heads "
                 f"ablated one at a time", missing=loss))
    diff = np.asarray(_group_mean(rows, "flagged", "zero")) - \
        np.asarray(_group_mean(rows, "control", "zero"))
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_matter_less_than_random",
        f"{name}: zero-ablating a sink head raises the loss less than zero-ablating a random "
        f"head", diff.tolist(), 0.0,
        what="each probe's mean loss change over the sink heads minus that over the control "
             "heads", missing=loss))
    out.append(_claim(
        cl.mean_at_least, f"{key}.sink_heads_cap_hurts",
        f"{name}: capping one sink head's first-token mass at 1 - {iv_rec['cap_eps']:g} raises "
        f"the loss", _group_mean(rows, "flagged", "cap"), 0.0,
        what=f"each probe's loss change, averaged over the {len(flagged)} sink heads capped "
             f"one at a time", missing=loss))
    return out


def head_verdicts(iv_rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per ablated head of one model's interventions: the mean loss change of each ablation
    with its bootstrap interval over probes, and whether the head fits the story (a sink head
    whose ablation is harmless and whose output is small) or contradicts it."""
    stats = iv_rec["head_stats"]
    norms = np.asarray(stats["output_norm"], dtype=float)  # (probes, layers, heads)
    first = np.asarray(stats["first"], dtype=float)
    value = np.asarray(stats["value_ratio"], dtype=float)
    control = nan_mean(_heads_value(stats, "output_norm", iv_rec["control"]), 1)  # (probes,)
    verdicts = []
    for row in iv_rec["heads"]:
        layer, head = row["layer"], row["head"]
        entry = {"layer": layer, "head": head, "group": row["group"],
                 "first": float(nan_mean(first[:, layer, head], 0)),
                 "value_ratio": float(nan_mean(value[:, layer, head], 0)),
                 "output": _summary((norms[:, layer, head] / control).tolist())}
        for how in ("zero", "mean", "cap"):
            entry[how] = _summary(row[how])
        if row["group"] == "flagged":
            lo, hi = entry["output"]["interval"]
            harmful = [h for h in ("zero", "mean") if entry[h]["interval"][0] > HARMLESS
                       or entry[h]["interval"][1] < -HARMLESS]
            harmless = all(-HARMLESS <= entry[h]["interval"][0] and entry[h]["interval"][1]
                           <= HARMLESS for h in ("zero", "mean"))
            reasons = [f"{h} ablation changes the loss" for h in harmful] + \
                (["it writes more than a random head"] if lo > 1 else [])
            entry["story"] = ("contradicts: " + "; ".join(reasons) if reasons else
                              "fits: ablating it is harmless and it writes less than a random "
                              "head" if harmless and hi < 1 else
                              "undetermined: an interval straddles its line")
        verdicts.append(entry)
    return verdicts


# ------------------------------------------------------------------------------ records


def _summary(values: list[float]) -> dict[str, Any]:
    """The mean of per-probe values with its bootstrap interval over probes."""
    arr = np.asarray(_finite(values), dtype=float)
    lo, hi = cl.bootstrap_mean(arr) if arr.size else (float("nan"), float("nan"))
    return {"mean": float(arr.mean()) if arr.size else float("nan"), "interval": [lo, hi],
            "n": int(arr.size)}


def described(done: dict[str, Any]) -> dict[str, Any]:
    """One model's interventions with what the report shows computed from them: each edit's
    mean and interval over probes, each ablated head's verdict, and the rank correlations over
    every head."""
    if done.get("refused") or done.get("not_measured"):
        return done
    out = {**done, "global": [{**g, "summary": _summary(g["per_probe"])}
                              for g in done["global"]]}
    if "baseline" not in done:  # an encoder: hidden-state changes only
        return out
    out["baseline_mean"] = float(nan_mean(np.asarray(done["baseline"], dtype=float), 0))
    out["streaming_missing"] = needs_text(done["streaming_needs"], done.get("prefix", []))
    out["streaming"] = [{**s, "summary": _summary(s["per_probe"])}
                        for s in done["streaming"]]
    out["verdicts"] = head_verdicts(out)
    out["contradicting"] = [v for v in out["verdicts"]
                            if v.get("story", "").startswith("contradicts")]
    stats = {k: nan_mean(np.asarray(v, dtype=float), 0).ravel()
             for k, v in done["head_stats"].items()}
    from scipy import stats as st

    for key, other in (("spearman", "output_norm"), ("spearman_value", "value_ratio")):
        x, y = stats["first"], stats[other]
        ok = np.isfinite(x) & np.isfinite(y)
        rho, p = (st.spearmanr(x[ok], y[ok]) if ok.sum() > 2 and np.ptp(x[ok]) > 0
                  and np.ptp(y[ok]) > 0 else (math.nan, math.nan))
        out[key] = {"rho": float(rho), "p": float(p), "n_heads": int(ok.sum())}
    return out
