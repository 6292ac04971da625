"""The contract every attention rule keeps, checked where a rule is used.

Every run's config calls its rule once, with its arguments, on small random finite scores and a
causal mask in the model's layout (a ``ParamRule`` built for a small layer and given an input
x), before any folder is written (``check_contract``, once per process for each rule and
arguments; it leaves torch's global random state alone). A rule that raises, returns None or
weights of another shape or dtype, gives non-finite weights (or builds non-finite parameters) on
finite input, or puts any weight on a masked key is a ``ContractError`` of one sentence naming
it, where it comes from and what it returned against what is expected (the rule's interface is
``sinklab.attention.registry``'s docstring). The tests parametrise over ``RULES``, so a new rule
is also checked for causality, large logits and the row layout automatically.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from sinklab.attention.registry import RuleInfo, build_checked, causal_mask, rule_info

# The layers the contract check builds and calls, as (members, batch, seq, heads) with a d_model
# of 4 (the smallest task.d_model): two heads, so that a row (query, head) is not its query,
# then one member, sequence and head at the shortest length. Small enough to be instant.
CONTRACT_LAYERS = ((2, 2, 5, 2), (1, 1, 4, 1))
CONTRACT_D_MODEL = 4
_CONTRACT: dict[tuple[Any, ...], str | None] = {}  # (rule, arguments) -> what is wrong, or None


class ContractError(ValueError):
    """A rule that breaks the contract of the module docstring; the message is one sentence
    naming the rule, where it comes from, and what it returned against what is expected."""


def first_line(exc: BaseException, most: int = 200) -> str:
    """An exception as a message quotes it: its type and the first line of its text (at most
    ``most`` characters of it)."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip().rstrip(".") if lines else ""
    if len(text) > most:
        text = text[:most - 5].rstrip() + " [...]"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_contract(name: str, kwargs: Mapping[str, Any] | None = None,
                   per_row: bool = False) -> None:
    """Build the rule ``name`` with its keyword arguments ``kwargs`` and call it once, as a
    layer does, on small random finite scores with a causal mask (``CONTRACT_LAYERS``), and
    with ``per_row`` (a model whose ``bos`` takes key 0 out of some rows) once more with a
    per-row mask that hides key 0 from some rows: a ContractError of one sentence unless its
    parameters are finite and it returns finite weights of the scores' shape and dtype,
    exactly 0 on every masked key, that the model can lay out and differentiate. Rows may sum
    to anything (a ReLU row may be all zero).

    Checked once per process for each rule and arguments (the config checks every run's rule
    with it, ``sinklab.config.ModelConfig``). It draws from a generator of its own and leaves
    torch's global random state as it found it, so it changes no run's numbers.
    """
    info = rule_info(name)
    kwargs = info.check_kwargs(kwargs or {})
    key = (info.rule, tuple(sorted(kwargs.items())), per_row)
    if key not in _CONTRACT:
        _CONTRACT[key] = _contract_problem(info, kwargs, per_row)
    if _CONTRACT[key] is not None:
        args = ", ".join(f"{k}={v!r}" for k, v in info.non_default(kwargs).items())
        where = "sinklab" if info.module == "sinklab" else f"plugin {info.module}"
        raise ContractError(f"attention rule {info.name!r} (from {where})"
                            f"{f' with {args}' if args else ''} {_CONTRACT[key]}")


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def _contract_problem(info: RuleInfo, kwargs: Mapping[str, Any], per_row: bool
                      ) -> str | None:
    """What the rule does wrong on the contract's layers (the end of a sentence), or None."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        for n_members, batch, seq, n_heads in CONTRACT_LAYERS:
            d_model = CONTRACT_D_MODEL
            built = f"built with n_members={n_members}, n_heads={n_heads}, d_model={d_model}"
            try:
                rule = build_checked(info, n_members, n_heads, d_model, kwargs)
                with torch.no_grad():  # as the model draws its members' weights
                    for member in range(n_members):
                        rule.init_member(member, generator, 0.02)
            except Exception as exc:
                return f"raised {first_line(exc)} when {built}."
            for pname, value in rule.state_dict().items():
                if value.is_floating_point() and not torch.isfinite(value).all():
                    return (f"has a parameter {pname!r} that is not finite ({_non_finite(value)}) "
                            f"when {built}: every parameter must be finite.")
            # the model's layout: scores (members * batch, query * head, key), rows (query,
            # head), the (query * head, key) mask, and the layer's input x (E, B, T, d)
            scores = torch.randn(n_members * batch, seq * n_heads, seq, generator=generator,
                                 dtype=torch.float32).mul_(3).requires_grad_()
            mask = causal_mask(seq).repeat_interleave(n_heads, dim=0)
            x = torch.randn(n_members, batch, seq, d_model, generator=generator,
                            dtype=torch.float32)
            given = f"on finite scores of shape {_shape(scores)} and a causal mask of shape " \
                    f"{_shape(mask)}"
            # and a per-row mask, key 0 hidden from every other row but query 0's (model.bos)
            rows = mask.expand(n_members * batch, *mask.shape).clone()
            rows[1::2, n_heads:, 0] = False
            hidden = f"on finite scores of shape {_shape(scores)} and a causal mask of shape " \
                     f"{_shape(rows)} that hides key 0 from some rows (model.bos='removed')"
            q = torch.randn(n_members, batch, seq, n_heads, d_model, generator=generator,
                            dtype=torch.float32) if rule.value_side else None
            for m, text in ((mask, given), (rows, hidden))[:2 if per_row else 1]:
                problem = _call_problem(rule, scores, m, x, text, q)
                if problem is not None:
                    return problem
    return None


def _call_problem(rule: nn.Module, scores: Tensor, mask: Tensor, x: Tensor, given: str,
                  q: Tensor | None = None) -> str | None:
    """What is wrong with one call of the rule and its backward pass, or None; a value-side
    rule (given the queries ``q``) also through ``mix`` and ``passed``."""
    if scores.grad is not None:
        scores.grad = None
    try:
        weights = rule(scores, mask, x) if q is None else rule(scores, mask, x, q)
    except Exception as exc:
        return f"raised {first_line(exc)} when called {given}."
    problem = _weights_problem(weights, scores, mask, given)
    total = weights.sum() if problem is None else None
    if problem is None and q is not None:
        problem, total = _mix_problem(rule, weights, x, q, given)
    if problem is None and total is not None and total.requires_grad:
        try:
            total.backward()
        except Exception as exc:
            problem = f"raised {first_line(exc)} in the backward pass of a call {given}."
    return problem


def _mix_problem(rule: nn.Module, weights: Tensor, x: Tensor, q: Tensor, given: str
                 ) -> tuple[str | None, Tensor | None]:
    """What is wrong with a value-side rule's ``mix`` and ``passed`` on mixed values of the
    layer's shape (E, B, Q, H, d), or None, with the sum to differentiate."""
    mixed = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    try:
        out = rule.mix(mixed, weights, x, q)
        share = rule.passed(mixed, out)
    except Exception as exc:
        return f"raised {first_line(exc)} in mix or passed after a call {given}.", None
    where = f"from mix after a call {given}"
    if not isinstance(out, Tensor) or out.shape != mixed.shape:
        got = _shape(out) if isinstance(out, Tensor) else type(out).__name__
        return f"returned {got} {where}, not mixed values of shape {_shape(mixed)}.", None
    if not torch.isfinite(out.detach()).all():
        return f"returned non-finite values ({_non_finite(out.detach())}) {where}.", None
    if share is not None and (not isinstance(share, Tensor) or share.shape != mixed.shape[:-1]
                              or not torch.isfinite(share.detach()).all()):
        want = str(tuple(mixed.shape[:-1]))
        return (f"returned a share from passed after a call {given} that is not a finite "
                f"tensor of shape {want}."), None
    return None, weights.sum() + out.sum()


def _weights_problem(weights: Any, scores: Tensor, mask: Tensor, given: str) -> str | None:
    """What is wrong with a rule's return value ``weights`` for ``scores`` and ``mask``."""
    if not isinstance(weights, Tensor):
        what = "None" if weights is None else f"a {type(weights).__name__}"
        return f"returned {what} {given}, not a tensor of weights of shape {_shape(scores)}."
    if weights.shape != scores.shape:
        return (f"returned weights of shape {_shape(weights)} {given}, not of the scores' "
                f"shape {_shape(scores)}.")
    if weights.dtype != scores.dtype:
        got, want = (str(t.dtype).removeprefix("torch.") for t in (weights, scores))
        return f"returned {got} weights {given}, not weights of the scores' dtype {want}."
    weights = weights.detach()
    if not torch.isfinite(weights).all():
        count = int((~torch.isfinite(weights)).sum())
        return (f"returned {count} non-finite weights ({_non_finite(weights)}) {given}: every "
                "weight must be finite.")
    leak = weights.masked_select(~mask.expand_as(weights)).abs()
    if leak.numel() and leak.max() != 0:
        return (f"put weight on masked keys {given}: the largest |weight| at a masked key is "
                f"{leak.max().item():.3g}, where it must be exactly 0.")
    n_rows, seq = scores.shape[0], scores.shape[-1]
    try:  # the model's two views of the weights (sinklab.model.Attention.forward)
        weights.view(n_rows, seq, -1)
        weights.view(n_rows, seq, -1, seq)
    except RuntimeError:
        return (f"returned weights {given} that the model cannot view in its layout (their "
                "strides do not allow it); return weights.contiguous().")
    return None


def _non_finite(values: Tensor) -> str:
    """Which non-finite values a tensor holds: "nan", "inf, -inf"."""
    kinds = [("nan", values.isnan()), ("inf", values.isposinf()), ("-inf", values.isneginf())]
    return ", ".join(word for word, where in kinds if where.any())
