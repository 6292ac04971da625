"""The pilot of ``sinklab pretrain``: the protocol at which softmax forms its sink, found first.

A study of sinks needs a baseline that sinks: at a budget where softmax forms none, "rule X forms
no sink" is true of softmax too and decides nothing. So before any contrast the study trains
softmax on screening seeds (``PILOT_SEEDS``, never seeds of a contrast or of a rate screen)
under each of the pilot's protocols (``PILOT``, declared with its criterion before it ran) and
reads from them where the sink appears:

- a protocol with a constant rate is read at its logged points: the run at any shorter budget
  is the same run stopped there, so one run per seed gives every budget up to the pilot's;
- a schedule that decays (cosine, warm-up-stable-decay) depends on its budget: it is read at
  its end only, beside the base protocol read at the same point;
- float32 is the check of bfloat16's arithmetic (same seeds, same settings otherwise): the
  validation losses at the float32 runs' budget must agree within ``PRECISION_TOLERANCE``.

Per seed, a sink appears at the first logged point from which the model's sink rate stays at
least ``SINK_RATE`` to the end of the pilot run, and a sink beyond layer 0 at the first point
from which some head of a later layer keeps a sink rate of at least ``PILOT_HEAD_RATE``; a
protocol has one when every seed has. The choice (``choose``): among the protocols where every
seed has a sink beyond layer 0, else among those where every seed has a sink, the one whose
training up to that point costs the fewest FLOPs (``sinklab.pretrain.runconfig.step_flops``);
the contrast trains ``BUDGET_MARGIN`` times as long (at most the pilot's budget), so that fresh
seeds, which may sink later than the pilot's three, sink too. The pilot has two stages
(``PILOT_STAGE``): the second trains only when the first chose no protocol, and the choice is
then made over both. When no protocol has a sink, the study stops after the pilot and says so
with its numbers.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from sinklab import metrics
from sinklab.definitions import GU_EPS
from sinklab.pretrain import data
from sinklab.pretrain.curves import held_from, point_summary
from sinklab.pretrain.runconfig import flops_per_token, from_dict
from sinklab.pretrain.training import MODEL, field_measure, load_model, read_curve
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_json
from sinklab.stats import finite_median
from sinklab.studies.pretrain import (
    PILOT,
    PILOT_BASE,
    PILOT_HEAD_RATE,
    PILOT_SEEDS,
    PILOT_STAGE,
    PILOT_WORDS,
    PRECISION_TOLERANCE,
    SINK_RATE,
    pilot_cells,
)
from sinklab.studies.study import Context, read_kept

BUDGET_MARGIN = 1.5  # the contrast's budget over the point the pilot chose
CHECK = "float32"  # the precision check, never a candidate
BASE = "base"


@functools.lru_cache(maxsize=4)
def _split(corpus: str, validation: float) -> Any:
    return data.split(corpus, validation)


def field_numbers(ctx: Context, name: str) -> dict[str, Any] | None:
    """A finished run's model measured the way the field measures it
    (``sinklab.pretrain.training.field_measure``, on ``GU_SAMPLES`` validation windows of its
    context), kept in the study's cache: Gu et al.'s first-64-token sink rate at eps = 0.3 and
    over ``EPS_GRID``, raw and relative; per layer the heads that sink there (a head's rate at
    least ``PILOT_HEAD_RATE``), Sun et al.'s massive activations on the first token and
    elsewhere, the first token's residual norm and the largest first-value norm over the
    others'. None for a run without a model (it diverged)."""
    folder = ctx.out / name
    if not (folder / MODEL).exists():
        return None
    summary = ctx.summary(name)

    def compute() -> dict[str, Any]:
        cfg = from_dict(summary["config"])
        split = _split(cfg.data.corpus, cfg.data.validation)
        windows = data.validation_windows(split.validation, metrics.GU_SAMPLES,
                                          cfg.model.context, cfg.data.fixed_first)
        full = field_measure(load_model(folder), windows)
        at = full["eps_grid"].index(GU_EPS)
        return {"windows": full["windows"], "first": full["first"],
                "eps_grid": full["eps_grid"], "rates": full["rates"],
                "rates_relative": full["rates_relative"], "rate": full["rates"][at],
                "rate_relative": full["rates_relative"][at],
                "layers": [{"sink_heads": sum(r >= PILOT_HEAD_RATE for r in layer["head_rates"]),
                            "head_rates": layer["head_rates"],
                            "massive_first": layer["massive"]["first"],
                            "massive_others": layer["massive"]["others"],
                            "top_dims": layer["massive"]["top_dims"],
                            "resid_ratio": layer["resid_ratio"],
                            "value_ratio_max": max(layer["value_ratio"])}
                           for layer in full["layers"]]}

    # kept quietly beside the study's other kept results: read at every round, not news
    path = ctx.out / "cache" / f"field-{name.replace('/', '-')}.json"
    settings = {"run": name, "steps": summary["steps"], "windows": metrics.GU_SAMPLES,
                "first": metrics.GU_FIRST}
    kept = read_kept(path, settings, "result")
    if kept is None:
        path.parent.mkdir(exist_ok=True)
        write_json(path, {"settings": settings, "result": compute()})
        kept = read_json(path)["result"]
    return kept


def run_record(folder: Path, protocol: str, seed: int,
               field: dict[str, Any] | None = None) -> dict[str, Any]:
    """A finished pilot run: its curve (model-level numbers per point), when its sink and its
    sink beyond layer 0 appeared (``held_from``), what its protocol costs per token, and the
    field's measurements of its final model (``field_numbers``)."""
    summary = read_json(folder / "summary.json")
    curve = [point_summary(p) for p in read_curve(folder)]
    cfg = from_dict(summary["config"])
    return {"protocol": protocol, "seed": seed, "tokens": summary["tokens"],
            "diverged": summary.get("status") == "diverged",
            "flops_per_token": flops_per_token(cfg), "schedule": cfg.train.schedule,
            "train_tokens": summary["data"]["train_tokens"],
            "tokens_per_s": summary["tokens_per_s"], "wall_time_s": summary["wall_time_s"],
            "sink_tokens": held_from(curve, [p["sink_rate"] >= SINK_RATE for p in curve]),
            "deep_tokens": held_from(curve, [any(layer > 0 for layer in p["sink_layers"])
                                             for p in curve]),
            "curve": curve, "field": field}


def records(ctx: Context, stages: tuple[int, ...] | None = None,
            field: bool = False) -> list[dict[str, Any]]:
    """The finished pilot runs of ``stages`` (default: those due, ``stages_due``), in
    ``PILOT``'s order; with ``field``, each with the field's measurements of its model
    (``field_numbers``: the report's, which the choice of protocol does not read)."""
    out = []
    for cell in pilot_cells(ctx.opts, ctx.exe, stages or stages_due(ctx)):
        if folders.check_complete(ctx.out / cell.name):
            out.append(run_record(ctx.out / cell.name, _protocol(cell.name),
                                  cell.config.train.seed,
                                  field_numbers(ctx, cell.name) if field else None))
    return out


def _protocol(name: str) -> str:
    return name.split("/", 1)[1].rsplit("_seed", 1)[0]


def _at(curve: list[dict[str, Any]], tokens: int) -> dict[str, Any] | None:
    """The logged point at ``tokens``, or None."""
    return next((p for p in curve if p["tokens"] == tokens), None)


def protocol_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol of ``PILOT``: its seeds finished, budget, cost per token and epochs over
    the text; the point at which every seed has a sink and one beyond layer 0 (a protocol read
    at its points: the latest seed's; a decaying schedule: its budget, when every seed ends
    with one), the FLOPs to get there; and its numbers at the end (median and range)."""
    rows = []
    ran = {r["protocol"] for r in runs}
    for name in PILOT:
        if PILOT_STAGE[name] > 1 and name not in ran:
            continue  # a later stage that did not run (or has not yet)
        mine = [r for r in runs if r["protocol"] == name and not r["diverged"]]
        finished = len(mine) == len(PILOT_SEEDS)
        first = mine[0] if mine else None
        budget = first["tokens"] if first else None
        readable = bool(first) and first["schedule"] == "constant"

        ends = [r["curve"][-1] for r in mine]
        if not finished:
            sink = deep = None
        elif readable:  # the latest seed's point
            sink, deep = (None if any(r[key] is None for r in mine) else
                          max(r[key] for r in mine) for key in ("sink_tokens", "deep_tokens"))
        else:  # read at the end only
            sink = budget if all(e["sink_rate"] >= SINK_RATE for e in ends) else None
            deep = budget if all(any(layer > 0 for layer in e["sink_layers"])
                                 for e in ends) else None
        fpt = first["flops_per_token"] if first else None
        rows.append({
            "protocol": name, "stage": PILOT_STAGE[name],
            "words": PILOT_WORDS.get(name, name), "seeds": len(mine),
            "of": len(PILOT_SEEDS), "diverged": sum(r["protocol"] == name and r["diverged"]
                                                    for r in runs),
            "schedule": first["schedule"] if first else None, "read_at_points": readable,
            "budget": budget, "flops_per_token": fpt,
            "epochs": budget / first["train_tokens"] if first else None,
            "sink_tokens": sink, "deep_tokens": deep,
            "sink_flops": sink * fpt if sink is not None else None,
            "deep_flops": deep * fpt if deep is not None else None,
            "with_sink": sum(e["sink_rate"] >= SINK_RATE for e in ends),
            "with_deep": sum(any(layer > 0 for layer in e["sink_layers"]) for e in ends),
            "sink_rate": _spread([e["sink_rate"] for e in ends]),
            "first_mass": _spread([e["first_mass"] for e in ends]),
            "val_loss": _spread([e["val_loss"] for e in ends]),
            "resid_ratio_max": _spread([e["resid_ratio_max"] for e in ends]),
            "sink_layers": sorted({layer for e in ends for layer in e["sink_layers"]}),
            "gu_rate": _spread([r["field"]["rate"] for r in mine if r.get("field")]),
            "tokens_per_s": finite_median([r["tokens_per_s"] for r in mine])})
    return rows


def _spread(values: list[float]) -> dict[str, float | None]:
    return {"median": finite_median(values), "low": min(values) if values else None,
            "high": max(values) if values else None}


def choose(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The protocol the contrast trains at (module docstring), with the point chosen, whether
    its sink reaches beyond layer 0, and the contrast's budget; None when no protocol has a
    sink in every seed."""
    candidates = [r for r in rows if r["protocol"] != CHECK]
    for deep, key in ((True, "deep"), (False, "sink")):
        ready = [r for r in candidates if r[f"{key}_tokens"] is not None]
        if not ready:
            continue
        best = min(ready, key=lambda r: (r[f"{key}_flops"], list(PILOT).index(r["protocol"])))
        point = best[f"{key}_tokens"]
        budget = min(best["budget"], max(_round_up(BUDGET_MARGIN * point), 100_000)) \
            if best["read_at_points"] else best["budget"]
        return {"protocol": best["protocol"], "words": best["words"], "point": point,
                "deep": deep, "budget": budget, "margin": BUDGET_MARGIN,
                "flops": best[f"{key}_flops"]}
    return None


def _round_up(tokens: float) -> int:
    """``tokens`` rounded up to a whole 100,000 (the budget a person reads)."""
    return int(math.ceil(tokens / 100_000) * 100_000)


def settings(choice: dict[str, Any]) -> dict[str, Any]:
    """The run settings of the chosen protocol at the contrast's budget (over the preset),
    in float32 when the precision check failed (``choice["precision"]``), but its rate
    (``softmax_rate``: softmax's; every other rule's is screened at this protocol)."""
    out = {**PILOT_BASE, **PILOT[choice["protocol"]], "tokens": choice["budget"]}
    out.pop("lr")
    if choice.get("precision"):
        out["precision"] = choice["precision"]
    return out


def softmax_rate(choice: dict[str, Any]) -> float:
    """Softmax's rate in the rounds after the pilot: the chosen protocol's own, since the sink
    the pilot found is a sink at that rate (a rate three times lower formed none in the pilot)."""
    return float({**PILOT_BASE, **PILOT[choice["protocol"]]}["lr"])


def precision_check(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """bfloat16 against float32 (``CHECK``), seed by seed: each float32 run's validation loss
    and sink rate at the last point both logged against the base protocol's there (the same run in
    all else: constant rate, same seed); passed when every seed's losses are within
    ``PRECISION_TOLERANCE``. None until both have finished."""
    pairs = []
    for seed in PILOT_SEEDS:
        check = next((r for r in runs if r["protocol"] == CHECK and r["seed"] == seed), None)
        base = next((r for r in runs if r["protocol"] == BASE and r["seed"] == seed), None)
        if check is None or base is None:
            return None
        # the last point both logged (the float32 run's own end need not be a base point)
        shared = {p["tokens"] for p in base["curve"]} & {p["tokens"] for p in check["curve"]}
        if not shared:
            return None
        end, there = _at(check["curve"], max(shared)), _at(base["curve"], max(shared))
        pairs.append({"seed": seed, "tokens": end["tokens"], "float32": end["val_loss"],
                      "bfloat16": there["val_loss"], "float32_sink": end["sink_rate"],
                      "bfloat16_sink": there["sink_rate"],
                      "float32_tokens_per_s": check["tokens_per_s"],
                      "bfloat16_tokens_per_s": base["tokens_per_s"]})
    largest = max(abs(p["bfloat16"] - p["float32"]) for p in pairs)
    return {"pairs": pairs, "largest_gap": largest, "tolerance": PRECISION_TOLERANCE,
            "passed": largest <= PRECISION_TOLERANCE}


def schedules(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each decaying schedule at its budget beside the base protocol read at the same point:
    seeds with a sink, median sink rate and validation loss."""
    out = []
    base = [r for r in runs if r["protocol"] == BASE]
    for row in rows:
        if row["read_at_points"] or row["protocol"] == CHECK or not row["seeds"]:
            continue
        there = [max((p for p in r["curve"] if p["tokens"] <= row["budget"]),
                     key=lambda p: p["tokens"]) for r in base]  # its last point by then
        out.append({"protocol": row["protocol"], "words": row["words"], "tokens": row["budget"],
                    "with_sink": row["with_sink"], "seeds": row["seeds"],
                    "sink_rate": row["sink_rate"]["median"],
                    "val_loss": row["val_loss"]["median"],
                    "base_with_sink": sum(p["sink_rate"] >= SINK_RATE for p in there),
                    "base_seeds": len(there),
                    "base_sink_rate": finite_median([p["sink_rate"] for p in there]),
                    "base_val_loss": finite_median([p["val_loss"] for p in there])})
    return out


def decided(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The choice (``choose``) with the precision the rounds after the pilot train in: float32
    when the precision check failed, as declared before the pilot ran."""
    choice = choose(protocol_rows(runs))
    check = precision_check(runs)
    if choice is not None and check is not None and not check["passed"]:
        choice = {**choice, "precision": "float32"}
    return choice


def collect(ctx: Context) -> dict[str, Any]:
    """The pilot's record: its runs, the table per protocol, the choice, the checks."""
    runs = records(ctx, field=True)
    rows = protocol_rows(runs)
    return {"seeds": list(PILOT_SEEDS), "base": dict(PILOT_BASE), "protocols": PILOT,
            "stages": list(stages_due(ctx)),
            "head_rate": PILOT_HEAD_RATE, "sink_rate": SINK_RATE, "margin": BUDGET_MARGIN,
            "rows": rows, "choice": decided(runs), "precision": precision_check(runs),
            "schedules": schedules(runs, rows), "runs": runs}


def _done(ctx: Context, stages: tuple[int, ...]) -> bool:
    return all(folders.check_complete(ctx.out / c.name)
               for c in pilot_cells(ctx.opts, ctx.exe, stages))


def stages_due(ctx: Context) -> tuple[int, ...]:
    """The pilot's stages to train: the first, and the second once the first has finished
    without choosing a protocol."""
    if not _done(ctx, (1,)) or choose(protocol_rows(records(ctx, (1,)))) is not None:
        return (1,)
    return (1, 2)


def finished(ctx: Context) -> bool:
    """Whether every pilot run of the stages due has finished."""
    return _done(ctx, stages_due(ctx))
