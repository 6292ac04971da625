"""Worst-case errors over every input, the necessity bound and norms, measured on models.

For 1x1 models (the theory study's ``frontier/{rule}_seed{s}``, the paper's protocol with the
weights saved every ``save_every`` steps, and any run ``sinklab worst`` is given), this module
computes:

- per row type and position, the error on sampled test sequences, the attack's lower bound on
  the supremum over every input (``sinklab.theory.attack``) and the certified upper bound
  (``sinklab.theory.certify``; at trigger rows ``sinklab.theory.trigger``);
- for ReLU, the largest score a non-trigger query can give any key (``certify.relu_max_score``):
  <= 0 certifies that those rows are zero for every input;
- for softmax, the necessity bound of docs/theory.md at every saved checkpoint, with its slack,
  and along the sink family;
- the worst-case error against the norm of W_Q W_K^T, for the family, the ReLU construction and
  the trained models;
- for the denied-sink runs, what the cap forces at row 1 by arithmetic (``denied_floor``).

The theory study (``sinklab.studies.theory_records``) runs these on its folders and keeps the
heavy parts (attacks, certificates) in its ``cache/``.

``worst_case`` refuses a model whose weights are not finite, and a certifiable one beyond the
certificate's float64 range (``certify.check_range``), before any work; after it, every certified
bound is checked against the attacked and sampled errors of the same rows
(``certify.check_sound``), so an unsound number never comes out as certified. ``worst_runs``
is ``sinklab worst``: it checks its options (at most ``attack.MAX_STEPS`` steps and
``attack.MAX_RESTARTS`` restarts) and every run folder first (a language-model run, a diverged
run, a sink attack whose restarts would not fit in memory are refused), then measures each.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from sinklab.config import RunConfig, build_run_config
from sinklab.errors import ConfigError, SinklabError
from sinklab.model import AttentionStack
from sinklab.plugins import check_run
from sinklab.pretrain.runconfig import KIND as LM_KIND
from sinklab.runs import folders, limits
from sinklab.runs.files import read_json
from sinklab.task import encode
from sinklab.theory import attack, certify, necessity, sink
from sinklab.theory import constructions as theory
from sinklab.theory.rows import NotCertifiable
from sinklab.theory.trigger import TriggerBounds
from sinklab.train import load_model

SAMPLED = 2000  # test sequences of the sampled errors (every trigger position)
CHECKPOINT_RESTARTS = 2  # random starts per row of the cheap attack at every checkpoint
ROUNDING = 1e-12  # relative: a bound and an error computed along two float64 paths may differ


class Refused(SinklabError):
    """A model or run that ``worst_case`` will not measure (it diverged, or its weights are not
    finite); the message says which and why in one sentence."""


def frontier_name(rule: str, seed: int) -> str:
    return f"frontier/{rule}_seed{seed}"


def frontier_config(rule: str, seed: int, save_every: int, device: str) -> RunConfig:
    """A 1x1 run of the paper's protocol that saves its weights every ``save_every`` steps."""
    return build_run_config({"model": {"attention": rule},
                             "train": {"seed": seed, "save_every": save_every,
                                       "log_every": save_every, "device": device}})


# --------------------------------------------------------------------------- measurements


def upper(value: float | None) -> float:
    """A certified upper bound read back from a record: JSON writes an unknown (infinite) bound
    as null, which bounds nothing."""
    return math.inf if value is None else value


@torch.no_grad()
def sampled_errors(model: AttentionStack, cfg: RunConfig, n: int = SAMPLED, seed: int = 0
                   ) -> dict[str, list[float | None]]:
    """The largest error per row type (``attack.KINDS``) and position over ``n`` random test
    sequences with the trigger anywhere in 2..L-1 (None where a type cannot occur)."""
    weight = next(model.parameters())
    batch = theory.all_triggers_batch(cfg, n, seed, dtype=torch.float64)
    net = copy.deepcopy(model).to(torch.float64)
    x, y = batch.x.to(weight.device), batch.y.to(weight.device)
    err = (net(x).out[0] - y).abs().amax(-1).cpu()  # (B, L)
    L = err.shape[1]
    pos = torch.arange(L)
    j = batch.trigger.cpu()[:, None]
    masks = {"bos": (pos == 0).expand_as(err), "pre": (pos >= 1) & (pos < j),
             "trigger": pos == j, "post": pos > j}
    out = {}
    for kind, mask in masks.items():
        vals = torch.where(mask, err, -math.inf).amax(0)
        out[kind] = [v if math.isfinite(v) else None for v in vals.tolist()]
    return out


def check_finite(model: AttentionStack, name: str = "the model") -> None:
    """Refused, naming ``name`` and the first weight that holds NaN or inf, unless every weight
    of the model is finite."""
    for param, w in model.named_parameters():
        if not torch.isfinite(w).all():
            raise Refused(f"{name} has weights that are not finite ({param} holds NaN or inf), "
                          "so it has no errors to measure; give a run whose weights are "
                          "finite.")


def worst_case(model: AttentionStack, cfg: RunConfig, *, steps: int, restarts: int,
               seconds: float, triggers: list[int] | None = None,
               certified: bool = True, name: str = "the model") -> dict[str, Any]:
    """Sampled, attacked and (for certifiable models, when ``certified``) certified errors of
    one model, its ||W_Q W_K^T|| (spectral norm, 1 layer: the largest over heads), the rule's
    own evidence (ReLU's largest non-trigger score, softmax's necessity quantities) and, for a
    full attack, the input attaining each row type's maximum (``witness``: trigger position,
    coordinate, sign and the (L, d - 3) contents).

    Refused before any work: weights that are not finite (``check_finite``) and, when
    certifying, weights beyond the certificate's float64 range (``certify.OutOfRange``).
    After it, ``certify.Unsound`` where a certified bound is below the attacked or sampled
    error of its row (``certify.check_sound``). ``name`` names the model in those sentences."""
    rule = cfg.model.attention
    check_finite(model, name)
    why = None
    try:  # what certify covers: 1 x 1, softmax or relu with default arguments, BOS visible
        f = certify.folded(model, cfg)
        single = True
    except NotCertifiable as exc:
        single, why = False, str(exc)
    if single and certified:
        certify.check_range(f, name)
    worst = attack.attack(model, cfg, steps=steps, restarts=restarts, triggers=triggers,
                          per_coordinate=False)
    out: dict[str, Any] = {"attacked": worst.to_dict("none")["error"],
                           "sampled": sampled_errors(model, cfg) if triggers is None else None,
                           "norm": qk_norm(model)}
    if why is not None:
        out["not_certifiable"] = why
    if triggers is None:  # the input attaining each row type's attacked maximum
        full = worst.to_dict("max")
        out["witness"] = {k: None if full["argmax"][k] is None
                          else full["witness"][k][full["argmax"][k]] for k in attack.KINDS}
    if single and certified:
        out["certified"] = certify.certify(model, cfg, time_limit=seconds,
                                           trigger_bounds=TriggerBounds).to_dict()
        # the last line of defence: a bound below an attained error is never reported
        certify.check_sound(out["certified"], {"attacked": out["attacked"],
                                               "sampled": out["sampled"]}, name, out["norm"])
    if single and rule == "relu":
        out["relu_score"] = certify.relu_max_score(model, cfg)
    if single and rule == "softmax":
        out["necessity"] = necessity.necessity(model, cfg)
    if single and certified and rule == "softmax":  # the sink the certified errors force
        out["sink"] = sink.certified_sink(model, cfg, out["certified"], nec=out["necessity"])
        out["sink_attack"] = sink.attack_sink(model, cfg, steps=steps, restarts=restarts)
        sink.check_attack(out["sink"], out["sink_attack"], name)
    return out


# What ``sinklab worst`` measures, for the sentences that refuse anything else.
ACCEPTED = ("sinklab worst takes finished run folders of `sinklab train` and the toy-model "
            "run folders inside a study's folder (such as runs/NAME of sinklab reproduce or "
            "sinklab zoo)")


def check_task_run(run: Path) -> None:
    """Refused, in one sentence naming ``run`` and what ``sinklab worst`` takes, where ``run``
    is a language-model run (``sinklab pretrain``'s, whose config has ``"kind": "pretrain"``)
    or a sinklab folder of another kind than a run (a study's, a --seeds folder of runs)."""
    kind = folders.kind_of(run) if run.is_dir() else None
    if kind == LM_KIND:
        raise Refused(f"{run} is a sinklab pretrain folder, whose runs are language models, "
                      f"not models of the trigger task; {ACCEPTED}.")
    if kind == "runs":
        raise Refused(f"{run} is a sinklab folder of seed runs (sinklab train --seeds), not a "
                      f"run folder; give its seed folders ({run / 'seed0'}, ...).")
    if kind is not None and kind != "run":
        raise Refused(f"{run} is a sinklab {folders.describe(kind)}, not a run folder; "
                      f"{ACCEPTED}.")
    try:
        config = json.loads((run / "config.json").read_text())
    except (OSError, ValueError):  # no readable config: load_model names what is wrong
        return
    if isinstance(config, dict) and config.get("kind") == LM_KIND:
        raise Refused(f"{run} holds a language-model run (sinklab pretrain), not a model of "
                      f"the trigger task; {ACCEPTED}.")


def sink_attack_rows(seq_len: int) -> int:
    """The (row, trigger position) pairs ``sink.attack_sink`` searches: every pre row with the
    trigger at L - 1, and every post row under every trigger position before it."""
    return (seq_len - 2) + (seq_len - 3) * (seq_len - 2) // 2


def sink_attack_bytes(model: AttentionStack, cfg: RunConfig, restarts: int) -> int:
    """An estimate of the memory ``sink.attack_sink`` takes with ``restarts`` starts: it
    searches every pair's starts as one batch of sequences (``attack.batch_bytes`` each, in
    float64), so its memory grows with the restarts."""
    L = cfg.task.seq_len
    return sink_attack_rows(L) * restarts * attack.batch_bytes(model, L, torch.float64)


def check_restarts(run: Path, model: AttentionStack, cfg: RunConfig, restarts: int) -> None:
    """ConfigError, in one sentence naming ``--restarts``, ``run`` and the most restarts that
    fit, where the sink attack of a certifiable softmax model (``worst_case``) would need more
    memory than the limit (``sinklab.runs.limits``); the other attacks work in chunks of a
    fixed size, whatever the restarts."""
    if cfg.model.attention != "softmax":
        return
    try:
        certify.folded(model, cfg)
    except NotCertifiable:  # no certificate, so no sink attack
        return
    need = limits.RUN_BYTES + sink_attack_bytes(model, cfg, restarts)
    limit = limits.memory_limit()
    if need <= limit:
        return
    most = (limit - limits.RUN_BYTES) // sink_attack_bytes(model, cfg, 1)
    allowed = (f"give --restarts {most:,} or fewer" if most >= 1 else
               "it does not fit even with one restart")
    raise ConfigError(f"--restarts={restarts!r} is too many for {run}: the sink attack of a "
                      f"1x1 softmax model searches the starts of all "
                      f"{sink_attack_rows(cfg.task.seq_len)} of its (row, trigger position) "
                      f"pairs at once, about "
                      f"{limits.format_bytes(need)} of memory, more than the limit of "
                      f"{limits.format_bytes(limit)} ({limits.MEMORY_ENV} sets it); {allowed}.")


def worst_run(run: Path, restarts: int | None = None) -> tuple[RunConfig, AttentionStack]:
    """The config and model of a finished run folder that ``worst_case`` may measure, checked
    before any work; one sentence naming the folder for a language-model run or a folder that
    is not a run (``check_task_run``), a run whose summary says it diverged, whose weights are
    not finite, or (1-layer, 1-head softmax or ReLU) whose weights are beyond the certificate's
    float64 range (``certify.check_range``), and with ``restarts``, a sink attack that would
    not fit in memory (``check_restarts``)."""
    check_task_run(run)
    check_run(run)  # a plugin's rule, not loaded now: one sentence naming --plugin
    cfg, model = load_model(run)
    summary = read_json(run / "summary.json")
    if summary.get("status") == "diverged":
        raise Refused(f"{run} holds a run that diverged (its loss was not finite at step "
                      f"{summary.get('steps')}), so its weights are not a trained model's and "
                      "no error or certificate of them would mean anything; give finished runs "
                      "that did not diverge.")
    check_finite(model, str(run))
    if restarts is not None:
        check_restarts(run, model, cfg, restarts)
    try:
        f = certify.folded(model, cfg)
    except NotCertifiable:  # no certificate to go out of range
        return cfg, model
    certify.check_range(f, str(run))
    return cfg, model


def worst_runs(runs: Sequence[Path], *, steps: int, restarts: int, seconds: float
               ) -> Iterator[str]:
    """``sinklab worst``: every run folder checked first (``worst_run``), then per run the lines
    to print: its shape and ||W_Q W_K^T||, per row type the sampled error, the attack's lower
    bound and the certified upper bound (or why there is none), the certificate's gap and, for
    ReLU, its largest non-trigger score."""
    attack.check_budget("--attack-steps", steps, attack.MAX_STEPS)
    attack.check_budget("--restarts", restarts, attack.MAX_RESTARTS)
    if not 0 < seconds <= 3600:
        raise ConfigError(f"--certify-seconds={seconds!r} is not allowed: it must be a number "
                          "of seconds in (0, 3600].")
    checked = [(Path(run), *worst_run(Path(run), restarts)) for run in runs]
    for run, cfg, model in checked:
        rec = worst_case(model, cfg, steps=steps, restarts=restarts, seconds=seconds,
                         name=str(run))
        cert = rec.get("certified")
        yield (f"{run}: {cfg.model.n_layers}x{cfg.model.n_heads} {cfg.model.attention}, "
               f"||W_Q W_K^T|| {rec['norm']:.3g}")
        for kind in ("bos", "pre", "post", "trigger"):
            sampled = max((v for v in rec["sampled"][kind] if v is not None), default=None)
            attacked = max((v for v in rec["attacked"][kind] if v is not None), default=None)
            if cert is None:
                certified = "not certified (see below)"
            elif kind == "trigger" and not cert.get("trigger_rows"):
                certified = "not certified (a record without trigger rows)"
            else:
                up = cert["bos"] if kind == "bos" else \
                    max(upper(r["upper"]) for r in _rows_of(cert, kind))
                certified = f"certified <= {up:.3e}"
            yield f"  {kind:8s} sampled {sampled:.3e}   attacked >= {attacked:.3e}   {certified}"
        if "not_certifiable" in rec:
            yield f"  not certified: {rec['not_certifiable']}"
        if cert is not None:
            parts = []
            for name, rows in (("non-trigger", cert["rows"]),
                               ("trigger", cert.get("trigger_rows", []))):
                if not rows:
                    continue
                gaps = [upper(r["upper"]) / r["lower"] for r in rows
                        if not r["converged"] and r["lower"] > 0]
                closed = sum(r["converged"] for r in rows)
                parts.append(f"{closed} of {len(rows)} {name} rows closed to {certify.RTOL:.0%}"
                             + (f" (largest gap left {max(gaps):.3g}x)" if gaps else ""))
            yield f"  certificate: {'; '.join(parts)}, in {cert['seconds']:.1f} s"
        if "sink" in rec:
            yield from sink.sink_lines(rec["sink"])
            found = {kind: max(v for v in rec["sink_attack"][kind]["off"] if v is not None)
                     for kind in ("pre", "post")}
            yield (f"  the attack's smallest BOS mass: {sink.mass_text(found['pre'])} at a pre "
                   f"row, {sink.mass_text(found['post'])} at a post row (inputs' masses, at or "
                   "above the certified bounds)")
        if "relu_score" in rec:
            score = rec["relu_score"]["max"]
            yield (f"  largest non-trigger score {score:.3e}: non-trigger rows "
                   + ("certified zero for every input" if score <= 0 else "not certified zero"))


def _rows_of(cert: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """A certificate record's rows of one kind: its trigger rows, or its non-trigger rows of
    that kind."""
    if kind == "trigger":
        return cert["trigger_rows"]
    return [r for r in cert["rows"] if r["kind"] == kind]


def qk_norm(model: AttentionStack) -> float:
    """The largest spectral norm of W_Q W_K^T over the model's layers and heads."""
    attn = [b.attn for b in model.blocks]
    return max(torch.linalg.matrix_norm(
        (a.w_q[0].detach().double() @ a.w_k[0].detach().double().transpose(-1, -2)), ord=2
    ).max().item() for a in attn)


def bound_check(record: dict[str, Any]) -> dict[str, Any]:
    """The necessity bound at one softmax model (a ``worst_case`` record with a necessity part):
    per pre row i, eps_i (the larger of the attack's error and the error at X*, both errors of
    real inputs, so lower bounds on the supremum), part 1's bound (1 - b_i(X*)) w* - nu and
    part 2's (1 - b_i(X*)) D - nu with D = 1 - eps_T - nu, the value lemma with the constant 1
    (``necessity.necessity``), eps_T the trigger row's error at L - 1 (the larger of the attack's
    and the proof inputs', ``proof_errors_full``); records from before that lemma have only the
    weaker D = delta - eps_T - nu with trigger content 0 (``proof_errors``), and where both are
    there the larger D is used. Then the worst violation (bound minus error, less ``ROUNDING``
    relative; negative: every row on the allowed side) and the slack eps_i / part 2 where part 2
    is positive."""
    nec = record["necessity"]
    att = record["attacked"]
    L = nec["seq_len"]
    nu, w_star, delta = nec["nu"], nec["w_star"], nec["delta"]
    eps_t = max(att["trigger"][L - 1], *nec["proof_errors"])
    lemma = delta - eps_t - nu
    if nec.get("proof_errors_full"):
        eps_t = max(att["trigger"][L - 1], *nec["proof_errors_full"])
        lemma = max(lemma, 1 - eps_t - nu)
    rows, worst, slacks = [], -math.inf, []
    for row in nec["rows"]:
        i, b = row["i"], row["bos"]
        eps = max(att["pre"][i], row["error"])
        one = (1 - b) * w_star - nu
        two = (1 - b) * lemma - nu
        # rounding: of the errors and part 1's terms, and of the trigger errors in the lemma
        allowance = ROUNDING * (abs(eps) + abs(one) + (1 - b) * (1 + eps_t + nu))
        worst = max(worst, max(one, two) - eps - allowance)
        slack = eps / two if two > 0 else None
        if slack is not None:
            slacks.append(slack)
        rows.append({"i": i, "bos": b, "error": eps, "part1": one, "part2": two,
                     "slack": slack})
    return {"rows": rows, "violation": worst, "eps_trigger": eps_t, "nu": nu,
            "w_star": w_star, "delta": delta, "lemma": lemma,
            "min_slack": min(slacks) if slacks else None,
            "max_off_bos": max(1 - r["bos"] for r in nec["rows"])}


def witness_form(nec: dict[str, Any]) -> dict[str, Any]:
    """The theorem in its finite-witness form at one softmax model (``necessity.necessity``'s
    record): from the errors at 2(d - 3) + 1 named inputs alone, X* (every content c*) and the
    proof inputs X+-_m (every non-BOS token +-e_m), at every pre row i

        1 - b_i(X*) <= (e_i(X*) + nu) / D,   D = max_m (1 - e_T(X+-_m) - nu),

    e_i(X*) the error at row i of X*, e_T(X+-_m) the larger trigger-row error at coordinate m of
    the two inputs X+-_m, nu the error at row 0 (the same at every input). Part 1 at X* gives
    (1 - b_i(X*)) W* <= e_i(X*) + nu, and the value lemma W* >= D. No supremum enters: anyone can
    evaluate it. D is lowered by ``certify.MARGIN`` times (1 + nu + W* + the largest e_T), the
    scale of the forward pass's rounding of those errors (a model with M = 0 has errors 1 - 1e-16
    at the trigger row: without it, D would be positive and the bound 0). Returned per row the
    bound (``off``: None where D <= 0, the bound vacuous) and the exact 1 - b_i(X*), and the
    weakest bound over the rows with the largest exact value."""
    nu = nec["nu"]
    full = nec.get("proof_errors_full") or []
    rounding = certify.MARGIN * (1 + nu + nec["w_star"] + max(full, default=0.0))
    denominator = max((1 - e - nu for e in full), default=-math.inf) - rounding
    rows = []
    for row in nec["rows"]:
        off = (row["error"] + nu) / denominator if denominator > 0 else None
        rows.append({"i": row["i"], "exact": 1 - row["bos"], "off": off})
    offs = [r["off"] for r in rows]
    return {"inputs": 2 * len(full) + 1, "denominator": denominator if full else None,
            "rows": rows, "off": None if None in offs or not offs else max(offs),
            "exact": max(r["exact"] for r in rows)}


def family_records(gaps: list[float], seq_len: int, d_model: int, steps: int,
                   seconds: float) -> list[dict[str, Any]]:
    """The sink family at each gap c: the certified non-trigger supremum (exactly 1 - b at
    the last row here), the attack's trigger error at L - 1, the necessity bound's parts and
    slack, and ||W_Q W_K^T||."""
    out = []
    for c in gaps:
        cfg, model = theory.softmax_sink(c, seq_len, d_model)
        rec = worst_case(model, cfg, steps=steps, restarts=CHECKPOINT_RESTARTS,
                         seconds=seconds, triggers=[seq_len - 1],
                         name=f"the sink family at c = {c:g}")
        cert = rec["certified"]
        out.append({"c": c, "norm": rec["norm"], "certified": cert["upper"],
                    "certified_lower": cert["lower"], "attacked": rec["attacked"],
                    "necessity": rec["necessity"]})
    return out


def with_checks(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries (checkpoints, final models or family members) with their necessity-bound
    check (``bound_check``) and the theorem's finite-witness form (``witness_form``) added where
    they have the measurements for it. Kept out of the cached measurements, so a rerun decides
    them afresh from them."""
    out = []
    for e in entries:
        if "necessity" in e:
            check = bound_check(e)
            e = {**e, "check": check, "witness_form": witness_form(e["necessity"])}
            if "c" in e:
                e["trigger"] = check["eps_trigger"]
        out.append(e)
    return out


def construction_record(seq_len: int, d_model: int, seconds: float) -> dict[str, Any]:
    """The ReLU construction's certified non-trigger error, largest score and norm."""
    cfg, model = theory.relu_construction(seq_len, d_model, dtype=torch.float64)
    cert = certify.certify(model, cfg, time_limit=seconds)
    return {"certified": cert.upper(), "converged": cert.converged,
            "relu_score": certify.relu_max_score(model, cfg), "norm": qk_norm(model)}


# ------------------------------------------------------------------------------ denied


def denied_floor(model: AttentionStack, cfg: RunConfig) -> dict[str, Any]:
    """What denying the sink forces at row 1 by arithmetic, from the weights alone, and the
    error at row 1 of the input the argument names (every content equal to ``witness``).

    Row 1 sees only BOS and x_1. With BOS removed its output is x_1 M, whose supremum error is
    max_m (|M[d-1, m]| + sum_r |M[r, m]|) exactly, attained at the vertex named. With BOS's
    share capped at 1 - eps the weight on x_1 is at least eps at every input, so part 1 of the
    necessity bound gives eps w* - nu (w* and nu as in ``necessity.necessity``), and the error at
    X* (every content c*) is at least that. For ReLU the floor is 0: its rows need not sum to
    one, and an all-zero row 1 outputs exactly zero whatever is denied."""
    attn = model.blocks[0].attn
    m = (attn.w_v[0, 0].detach().double() @ attn.w_o[0, 0].detach().double())
    d = m.shape[0]
    nu = m[0].abs().max().item()
    removed = cfg.model.bos == "removed"
    widest, _, witness = necessity.widest_value(m, relative_to_bos=not removed)
    if cfg.model.attention != "softmax":
        floor = 0.0  # a ReLU row may be all zero: denying BOS forces nothing at row 1
    elif removed:
        floor = widest
    else:
        floor = max(cfg.model.bos_cap_eps * widest - nu, 0.0)
    L = cfg.task.seq_len
    x = encode(witness.expand(1, L, d - 3).clone(), torch.tensor([L - 1], device=m.device))
    _, err = necessity.forward_errors(model, cfg, x)
    return {"floor": floor, "nu": nu, "w_star": widest, "at_witness": err[0, 1].abs().max().item()}
