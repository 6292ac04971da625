"""The two kinds of training run a study can declare, read one way by the machinery that plans,
trains and records runs (``sinklab.studies.runner``, ``sinklab.sweeps.run``).

- a task run (``sinklab.config.RunConfig``): the paper's toy models, trained as ensembles of
  members that share everything but seed and learning rate (``sinklab.train``);
- a language-model run (``sinklab.pretrain.runconfig.PretrainConfig``, whose dictionary carries
  ``"kind": "pretrain"``): one model per process (``sinklab.pretrain.training``).

Both have ``train.seed``, ``train.device`` and ``model.attention``, and a ``to_dict`` that
``from_dict`` reads back; what differs (building from a dictionary, the memory a job needs, its
cost, how to train it, how to say what it reached) is dispatched here. Without torch: the help
texts read this module.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sinklab import formats as md
from sinklab import heavy
from sinklab.config import RunConfig, build_run_config
from sinklab.pretrain import runconfig as pretrain_settings
from sinklab.pretrain.runconfig import PretrainConfig
from sinklab.runs import limits

Config = RunConfig | PretrainConfig


def from_dict(values: dict[str, Any]) -> Config:
    """A run's config from its dictionary (``config.json``, a job's payload)."""
    if values.get("kind") == pretrain_settings.KIND:
        return pretrain_settings.from_dict(values)
    return build_run_config(values)


def is_pretrain(cfg: Config) -> bool:
    return isinstance(cfg, PretrainConfig)


def run_bytes(cfg: Config, members: int = 1) -> int:
    """The memory a job of ``members`` runs of ``cfg`` needs (a language model trains alone)."""
    if is_pretrain(cfg):
        return pretrain_settings.run_bytes(cfg) * members
    return limits.run_bytes(cfg, members)


def members_that_fit(cfg: Config, wanted: int, what: str) -> int:
    """The most runs of ``cfg`` (up to ``wanted``) to train as one job: language models one at
    a time, refused in one sentence when even one does not fit."""
    if is_pretrain(cfg):
        pretrain_settings.check_memory(cfg, what)
        return 1
    return limits.members_that_fit(cfg, wanted, what)


def cost(cfg: Config, members: int) -> float:
    """A job's work at most, in attention weights times steps (a standard block's MLP counted
    as much again; a language model's MLP and head twice), so that jobs of both kinds start
    longest first and the last ones to finish are short."""
    if is_pretrain(cfg):
        m = cfg.model
        per_step = cfg.train.batch_size * m.n_layers * m.n_heads * m.context ** 2
        return float(per_step * cfg.steps * 3 * members)  # the MLP and the head: as much again
    return float(cfg.model.n_layers * cfg.model.n_heads * cfg.task.seq_len ** 2
                 * cfg.train.max_steps * (2 if cfg.model.block == "standard" else 1) * members)


PARTIAL_ENV = "SINKLAB_PARTIAL_DIR"  # where a study keeps language models in training
PARTIAL = ".partial"  # that folder, inside the study's own folder


def resume_dirs(cfgs: Sequence[Config], names: Sequence[str]) -> list[Path] | None:
    """Where a job of language models trains so that an interrupted study resumes each one
    from its last checkpoint: ``$SINKLAB_PARTIAL_DIR/NAME`` (set by the study's driver to
    ``.partial`` in its folder; a worker on another machine has none and trains in a temporary
    folder, None). A folder left there by a run with other settings is the study's own scratch
    and is cleared first. Task runs are short: None."""
    root = os.environ.get(PARTIAL_ENV)
    if not root or not cfgs or not is_pretrain(cfgs[0]) or not Path(root).is_dir():
        return None
    dirs = [Path(root) / name for name in names]
    for cfg, folder in zip(cfgs, dirs):
        try:
            kept = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            kept = None
        if folder.exists() and kept != json.loads(json.dumps(cfg.to_dict())):
            shutil.rmtree(folder)
    return dirs


def train(cfgs: Sequence[Config], dirs: Sequence[Path]) -> None:
    """Train the runs of one job into ``dirs`` (each writes its own ``summary.json``)."""
    lm_training = heavy("pretrain.training")
    training = heavy("train")

    if cfgs and is_pretrain(cfgs[0]):
        for cfg, folder in zip(cfgs, dirs):
            lm_training.train(cfg, folder)
        return
    training.train_runs(list(cfgs), list(dirs), progress=False)


def describe(summaries: list[dict[str, Any]], seconds: float) -> str:
    """What a job's runs reached, for the log line of a finished job."""
    if summaries and summaries[0].get("kind") == pretrain_settings.KIND:
        diverged = [s for s in summaries if s.get("status") == "diverged"]
        if diverged:
            return f"diverged at step {diverged[0]['diverged_step']}, {seconds:.0f} s"
        losses = [s["final"]["val_loss"] for s in summaries]
        loss = (f"{losses[0]:.3f}" if len(losses) == 1
                else f"{min(losses):.3f}-{max(losses):.3f}")
        speed = sum(s["tokens_per_s"] for s in summaries) / len(summaries)
        return (f"validation loss {loss} nats per token, {speed:,.0f} tokens/s, "
                f"{seconds:.0f} s")
    steps = [s["steps"] for s in summaries]
    converged = sum(s["converged"] for s in summaries)
    step_text = f"{steps[0]}" if len(steps) == 1 else f"{min(steps)}-{max(steps)}"
    extra = "".join(f"; seed {s['seed']} {s['status']}" for s in summaries
                    if s["status"] == "diverged")
    plateau = sum(s["status"] == "plateau" for s in summaries)
    stops = f", plateau {plateau}/{len(summaries)}" if plateau else ""
    return (f"reached the stop rule {converged}/{len(summaries)}{stops}, steps {step_text}, "
            f"{_sinks(summaries)}{seconds:.0f} s{extra}")


def _span(values: list[Any], text: Any = str) -> str:
    low, high = min(values), max(values)
    return text(low) if low == high else f"{text(low)} to {text(high)}"


def _sinks(summaries: list[dict[str, Any]]) -> str:
    """'sink heads 1/1 (BOS mass 1 - 2.30e-04), ': what a finished task run's heads do at
    non-trigger rows, so the log shows the sink as each run ends (the most-BOS head's mass)."""
    kept = [s for s in summaries if s.get("status") != "diverged"
            and s.get("bos_mass_nontrigger") is not None]
    if not kept:
        return ""
    heads = kept[0]["n_layers"] * kept[0]["n_heads"]
    most = [max(max(layer) for layer in s["bos_mass_nontrigger"]) for s in kept]
    sinks = [s["sink_heads"] for s in kept]
    count = f"{min(sinks)}" if min(sinks) == max(sinks) else f"{min(sinks)}-{max(sinks)}"
    return (f"sink heads {count} of {heads} (most-BOS head's "
            f"non-trigger BOS mass {_span(most, md.mass_text)}), ")
