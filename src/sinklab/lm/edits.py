"""The interventions of ``sinklab lm``: the paper's story tested in a real model by editing it.

The paper's story is that a sink is how softmax attention does nothing: a head that must output
zero parks its weight on a token whose value is (near) zero. For a causal LM this module reads,
per (layer, head), the first token's attention mass, the norm of the first token's value vector
against the other tokens' (Guo et al.'s value-state drain) and the norm of the head's output
at each query, all from one hooked pass (``sinklab.lm.capture``), and it measures by the
next-token loss what happens when the model is edited (``sinklab.lm.interventions``):

- every layer at once: the first key hidden from every query, the first value zeroed, the first
  key's mass capped at 1 - eps, and StreamingLLM's cache (the first k tokens plus a window),
  each by query-position band too (``BANDS``) and each with a control, the same edit on a
  random other key of each query's row (or a random old token kept in place of the first);
  with the first key hidden, where its weight goes (``Moved``: to position 1, 2-3 or later);
- every head alone (the head sweep): zero ablation, mean ablation and capping its first-token
  mass, so that the sink heads can be compared with random sets of other heads
  (``sinklab.lm.head_sets``);
- every trigger-conditional head the finder keeps: its zero ablation's loss change at its trigger
  tokens against elsewhere (read from the sweep).

Every number is per probe (and the sweep's per head), so that intervals can resample both. A
head ablation reruns only the layers from the head's own one on, from the residual stream
cached in the baseline pass, with the probes batched (``Settings.batch_size`` per pass); every
tensor stays on the model's device until a per-probe number is read off it. An encoder has no
next-token loss: for it the global edits are measured by the relative change of the final
hidden states.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from sinklab import metrics
from sinklab.hooks import Hooks
from sinklab.lm import capture, trigger_heads
from sinklab.lm import interventions as iv
from sinklab.lm import loading as lm
from sinklab.lm.settings import (
    BANDS,
    CONTROL_SEED,
    DESTINATIONS,
    LOSS_TOKENS,
    MOVED_FROM,
    SINK_TOKENS,
    band_label,
)
from sinklab.stats import nan_mean


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
    """Where finished stages are kept (``sinklab.studies.study.Stages``): ``keep(name,
    compute)`` gives the stage's kept result, or computes it and keeps it, returned as it will be
    read back."""

    def keep(self, name: str, compute: Callable[[], Any]) -> Any: ...


class Unkept:
    """Stages kept nowhere: every stage is computed."""

    def keep(self, name: str, compute: Callable[[], Any]) -> Any:
        return compute()


def batches(ids: Tensor, mask: Tensor, size: int) -> Iterator[tuple[Tensor, Tensor]]:
    for start in range(0, ids.shape[0], size):
        yield ids[start:start + size], mask[start:start + size]


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


def bands(values: Tensor, where: Tensor) -> list[dict[str, Any]]:
    """An edit's change per probe in each position band of ``BANDS`` (``measured`` over the
    positions of the band that ``where`` selects), with the band's label."""
    out = []
    position = torch.arange(values.shape[1], device=values.device)
    for start, end in BANDS:
        inside = (position >= start) & (position < (end if end is not None else len(position)))
        out.append({"band": band_label(start, end), "start": start, "end": end,
                    **measured(values, where & inside)})
    return out


def _global_edits(cap_eps: float, n_layers: int) -> list[tuple[str, str, Hooks, str, str]]:
    """The edits made at every layer and head at once: (key, label, hooks, the row edit of
    its control (``interventions.chosen_keys``), the control's label)."""
    return [
        ("hide_first_key", "the first key hidden from every query (softmax renormalised)",
         iv.hide_first_key(n_layers), "hide",
         "a random other key hidden from each query (renormalised)"),
        ("zero_first_value", "the first token's value zeroed in every head",
         iv.zero_first_value(n_layers), "drop",
         "a random other key's value removed from each query's row"),
        ("cap_first_mass", f"the first key's mass capped at 1 - {cap_eps:g} in every head",
         iv.cap_first_mass(cap_eps, n_layers), "cap",
         f"a random other key's mass capped at 1 - {cap_eps:g} in each query's row"),
    ]


def sink_heads(first: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The ``n`` heads with the most first-token mass (``first`` (layers, heads), mean over
    probes; at most half the heads, so that as many others remain for the control sets)."""
    heads = first.shape[1]
    order = np.argsort(-np.nan_to_num(first, nan=-1.0), axis=None, kind="stable")
    return [divmod(int(i), heads) for i in order[:min(n, first.size // 2)]]


class Moved:
    """Where a hidden first key's weight goes: per probe and (layer, head), sums over the real
    queries from ``MOVED_FROM`` on of the weight on each key group of ``DESTINATIONS``, read
    by a hook after the first key is hidden (``hidden``) or from the unedited pattern
    (``plain``, with the first key's own weight first and what the groups would get if the
    first key's weight were handed out in proportion to the others' weights)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.parts: dict[str, list[list[Tensor]]] = {
            k: [[] for _ in range(n_layers)] for k in ("plain", "hidden", "proportional")}
        self.valid: Tensor | None = None  # (B, T) of the batch running

    def _rows(self, pattern: Tensor) -> Tensor:
        queries = torch.arange(pattern.shape[-2], device=pattern.device)
        return (self.valid.to(pattern.device) & (queries >= MOVED_FROM))[:, None, :, None]

    @staticmethod
    def _groups(pattern: Tensor) -> Tensor:
        """(B, H, Q, K) -> (B, H, Q, groups): the weight on each destination group."""
        return torch.stack([pattern[..., start:end].sum(-1) for start, end in DESTINATIONS],
                           dim=-1)

    def read(self, layer: int, kind: str) -> Callable[[Tensor, str], None]:
        def hook(pattern: Tensor, name: str) -> None:  # (B, H, Q, K)
            p = pattern.float()
            rows = self._rows(p).to(p.dtype)  # (B, 1, Q, 1)
            groups = self._groups(p)
            if kind == "plain":
                first = p[..., :1]
                # each group's share of the other keys' weight, summed directly (1 - w_0
                # cancels when w_0 is near 1): at most 1, 0 for a row with no other weight
                rest = p[..., 1:].sum(-1, keepdim=True)
                share = groups / rest.clamp(min=torch.finfo(p.dtype).tiny)
                self.parts["proportional"][layer].append(
                    (first * share * rows).sum(2).cpu())  # (B, H, groups)
                groups = torch.cat([first, groups], dim=-1)
            self.parts[kind][layer].append((groups * rows).sum(2).cpu())
        return hook

    def hooks(self, kind: str) -> Hooks:
        return Hooks({f"blocks.{layer}.attn.pattern": self.read(layer, kind)
                      for layer in range(self.n_layers)})

    def arrays(self) -> dict[str, list]:
        """(probes, layers, heads, groups) each; ``plain`` has the first key's weight first."""
        return {k: torch.stack([torch.cat(p) for p in parts], dim=1).tolist()
                for k, parts in self.parts.items()}


def run_causal(loaded: lm.LoadedModel, ids: Tensor, mask: Tensor, settings: Settings,
               triggers: list[dict[str, Any]], log: Callable[[str], None],
               stages: Stages | None = None) -> dict[str, Any]:
    """Every intervention on a causal LM; ``ids``/``mask`` (probes, T) padded on the right,
    ``triggers`` the finder's heads (layer, head, token ids). Each stage (the head statistics,
    the global edits, each layer of the head sweep) is kept in ``stages`` as it finishes, and a
    stage kept there is not computed again; the baseline pass runs every time (the ablations
    restart from the residual stream it caches)."""
    stages = stages or Unkept()
    start = time.perf_counter()
    model = loaded.model
    n_layers, n_heads = loaded.n_layers, loaded.n_heads
    size = settings.batch_size
    stats, moved = HeadStats(n_layers), Moved(n_layers)
    keep = [f"blocks.{layer}.resid_pre" for layer in range(n_layers)]
    base, resid = [], []  # per batch: losses (B, T-1), {layer: resid_pre}
    for b_ids, b_mask in batches(ids, mask, size):
        stats.valid = moved.valid = b_mask.bool().to(loaded.device)
        hooks = Hooks(stats.hooks(causal=True), keep=keep).merged(moved.hooks("plain"))
        base.append(iv.token_losses(model, b_ids, b_mask, hooks=hooks))
        resid.append({int(n.split(".")[1]): t for n, t in hooks.cache.items()
                      if n.endswith("resid_pre")})
    baseline = torch.cat(base)
    scored = ~baseline.isnan()
    log(f"lm: {loaded.source.name}: interventions: baseline and head statistics "
        f"({time.perf_counter() - start:.0f} s)")
    means = stats.means()
    heads = stages.keep("head_stats",
                        lambda: {k: v.tolist() for k, v in stats.arrays().items()})
    # the controls' random keys, one per query row, seeded (the same on every device)
    valid = mask.bool()
    chosen = {"row": iv.key_mask(iv.random_keys(valid, seed=CONTROL_SEED)),
              "old": iv.key_mask(iv.random_keys(valid, back=settings.window,
                                                seed=CONTROL_SEED + 1))}

    def change(hooks_for: Callable[[slice], Hooks], layer: int | None = None) -> Tensor:
        """Loss change per position (probes, T-1), rerunning from ``layer`` when given;
        ``hooks_for(rows)`` gives the hooks for the probes ``rows`` of one batch."""
        parts = []
        for i, (b_ids, b_mask) in enumerate(batches(ids, mask, size)):
            hooks = hooks_for(slice(i * size, i * size + len(b_ids)))
            if layer is None:
                parts.append(iv.token_losses(model, b_ids, b_mask, hooks=hooks))
            else:
                parts.append(iv.losses_from_layer(model, resid[i][layer], layer, b_ids, b_mask,
                                                  hooks=hooks))
        return torch.cat(parts) - baseline

    def fixed(hooks: Hooks) -> Callable[[slice], Hooks]:
        return lambda rows: hooks

    compared = compared_from(settings.window)  # loss index t is query t
    where = scored.clone()
    where[:, :compared] = False

    def edit_record(delta: Tensor, at: Tensor) -> dict[str, Any]:
        return {**measured(delta, at), "bands": bands(delta, at),
                "per_position": per_position(delta, scored)}

    def global_edits() -> dict[str, Any]:
        edits = []
        for key, label, hooks, row_edit, control_label in _global_edits(settings.cap_eps,
                                                                          n_layers):
            if key == "hide_first_key":  # where the hidden weight goes, read in the same pass
                def hidden(rows: slice, hooks: Hooks = hooks) -> Hooks:
                    moved.valid = valid[rows].to(loaded.device)
                    return hooks.merged(moved.hooks("hidden"))
                delta = change(hidden)
            else:
                delta = change(fixed(hooks))
            control = change(lambda rows, row_edit=row_edit: iv.chosen_keys(
                row_edit, chosen["row"][rows], n_layers, eps=settings.cap_eps))
            edits.append({"key": key, "label": label, **edit_record(delta, scored),
                          "control": {"label": control_label,
                                      **edit_record(control, scored)}})
        streams = []
        if bool(where.any()):  # some loss position is compared
            for k in SINK_TOKENS:
                delta = change(fixed(iv.streaming(k, settings.window, n_layers)))
                streams.append({"k": k, **edit_record(delta, where)})
            delta = change(lambda rows: iv.chosen_keys("stream", chosen["old"][rows], n_layers,
                                                       window=settings.window))
            streams.append({"k": "random", **edit_record(delta, where)})
        return {"global": edits, "streaming": streams, "moved": moved.arrays()}

    kept = stages.keep("global", global_edits)
    log(f"lm: {loaded.source.name}: interventions: global edits, their controls and "
        f"streaming ({time.perf_counter() - start:.0f} s)")
    sinks = sink_heads(nan_mean(np.asarray(heads["first"], dtype=float), 0), settings.n_heads)
    found = {(t["layer"], t["head"]): t for t in triggers}

    def targeted(layer: int, head: int, delta: Tensor) -> dict[str, Any]:
        tokens = torch.tensor([t["id"] for t in found[(layer, head)]["tokens"]],
                              device=scored.device)
        is_trigger = torch.isin(ids[:, :-1].to(scored.device), tokens) & scored
        effect = trigger_heads.targeted_effect(delta.nan_to_num().cpu().numpy(),
                                               is_trigger.cpu().numpy(), scored.cpu().numpy())
        return {"layer": layer, "head": head,
                "tokens": [t["token"] for t in found[(layer, head)]["tokens"]],
                "summary": effect}

    def sweep(layer: int) -> dict[str, Any]:
        """Every head of ``layer`` ablated three ways, one at a time: per probe, the loss
        change of each; the finder's heads also get the targeted comparison."""
        rows, aimed = [], []
        for head in range(n_heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            for how, hooks in (("zero", iv.ablate_heads([(layer, head)], "zero")),
                               ("mean", iv.ablate_heads([(layer, head)], "mean",
                                                        {(layer, head): means[layer][head]})),
                               ("cap", iv.cap_first_mass(settings.cap_eps, n_layers,
                                                         layers=[layer], heads=[head]))):
                delta = change(fixed(hooks), layer)
                row[how] = per_probe(delta, scored)
                row[f"{how}_bands"] = [float(np.nanmean(b["per_probe"]))
                                       if b["n_probes"] else None
                                       for b in bands(delta, scored)]
                if how == "zero" and (layer, head) in found:
                    aimed.append(targeted(layer, head, delta))
            rows.append(row)
        return {"heads": rows, "targeted": aimed}

    out: dict[str, Any] = {"baseline": per_probe(baseline, scored), **kept, "heads": [],
                           "targeted": [], "n_positions": int(scored.sum()),
                           "n_scored_probes": int(scored.any(1).sum())}
    for layer in range(n_layers):
        done = stages.keep(f"sweep {layer}", lambda layer=layer: sweep(layer))
        out["heads"].extend(done["heads"])
        out["targeted"].extend(done["targeted"])
        log(f"lm: {loaded.source.name}: interventions: layer {layer + 1} of {n_layers}: its "
            f"{n_heads} heads ablated ({time.perf_counter() - start:.0f} s)")
    order = {(t["layer"], t["head"]): i for i, t in enumerate(triggers)}
    out["targeted"].sort(key=lambda t: order[(t["layer"], t["head"])])
    out.update({"head_stats": heads, "sink_heads": [list(h) for h in sinks],
                "compared_from": compared, "streaming_needs": streaming_tokens(settings.window),
                "bands": [band_label(a, b) for a, b in BANDS],
                "destinations": [band_label(a, b) for a, b in DESTINATIONS],
                "moved_from": MOVED_FROM, "seconds": time.perf_counter() - start})
    return out


def run_encoder(loaded: lm.LoadedModel, ids: Tensor, mask: Tensor, settings: Settings
                ) -> dict[str, Any]:
    """The global edits on an encoder, measured by the relative change of the final hidden
    states (an encoder has no next-token loss), by position band too."""
    start = time.perf_counter()
    out: dict[str, Any] = {"global": []}
    for key, label, hooks, _, _ in _global_edits(settings.cap_eps, loaded.n_layers):
        parts, valid = [], []
        for b_ids, b_mask in batches(ids, mask, settings.batch_size):
            parts.append(iv.hidden_change(loaded.model, b_ids, b_mask, hooks=hooks))
            valid.append(b_mask.bool())
        delta, where = torch.cat(parts), torch.cat(valid).to(parts[0].device)
        out["global"].append({"key": key, "label": label, **measured(delta, where),
                              "bands": bands(delta, where)})
    out["bands"] = [band_label(a, b) for a, b in BANDS]
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
