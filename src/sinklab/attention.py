"""Attention rules: from raw scores plus a causal mask to attention weights.

A rule takes ``scores`` of shape (..., q, k) and a boolean ``mask`` that broadcasts against them,
True where query q may see key k, and returns weights of the same shape as ``scores`` with exactly
0 on every masked key. The key axis is always last. The model passes scores laid out
(members * batch, query * head, key), rows ordered (query, head), with the matching
(query * head, key) causal mask, or, where some rows may not see key 0 (``model.bos``
"removed" or "ablated": BOS taken out of those rows' keys, whatever the rule does with its
keys), a (members * batch, query * head, key) mask: a rule must not assume that a row's index is
its query position, nor that every row sees key 0.

A rule is registered once, with its metadata: ``@register("name", row_kind=..., kwargs=...)``
records a ``RuleInfo`` (``rule_info(name)``): the function or class, what a row of its weights
can sum to, its description (the docstring's first paragraph), whether it learns parameters,
and its keyword arguments. Most rules are plain functions. A rule with parameters (a learned sink
logit, an output gate) is an ``nn.Module`` subclass of ``ParamRule``, registered the same way; it
owns its parameters with a leading member axis, like the model's weights, and also sees the
layer's input (for a gate computed from the query token).

A rule's keyword arguments are the keyword-only parameters of the function after
``(scores, mask)``, or of the class's constructor after ``(n_members, n_heads, d_model)``: their
types and defaults are read off the signature, their meaning and allowed values from the
registration's ``Arg``. ``build_rule`` checks them and turns either kind into a module, which the
attention layer builds once::

    rule = build_rule("relu", n_members=1, n_heads=2, d_model=16)
    rule = build_rule("softmax", 1, 2, 16, temperature=2.0)
    weights = rule(scores, mask, x)        # x: the layer's input (members, batch, seq, d_model)

The config passes them as ``model.attention_args``; ``sinklab rules`` lists every rule with its
row kind and keyword arguments. A float argument must also fit the float32 the model computes in
(|x| <= ``FLOAT32_MAX``, 3.4e38): ``sink_logit``'s ``init=1e308`` would overflow to inf.

The contract is checked where a rule is used: every run's config calls its rule once, with its
arguments, on small random finite scores and a causal mask in the model's layout (a
``ParamRule`` built for a small layer and given an input x), before any folder is written
(``check_contract``, once per process for each rule and arguments; it leaves torch's global
random state alone). A rule that raises, returns None or weights of another shape or dtype,
gives non-finite weights (or builds non-finite parameters) on finite input, or puts any weight
on a masked key is a ``ContractError`` of one sentence naming it, where it comes from and what
it returned against what is expected. The tests parametrise over ``RULES``, so a new rule is
also checked for causality, large logits and the row layout automatically.

A rule of your own is registered the same way from a module outside sinklab, a plugin
(``sinklab.plugins``: ``--plugin MODULE`` on the command line, or an entry point of the group
``sinklab.rules``); ``RuleInfo.module`` records where each rule comes from (``"sinklab"`` for
these). A name can be registered once: a second registration is a ValueError naming the first.
"""

from __future__ import annotations

import inspect
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

AttentionRule = Callable[..., Tensor]  # (scores, mask, *, **kwargs) -> weights


class ParamRule(nn.Module):
    """A rule with learned parameters of shape (members, heads, ...).

    ``forward(scores, mask, x)`` works on the model's layout (members * batch, query * head, key)
    with the layer's input x (members, batch, seq, d_model); ``head(member, head)`` returns the
    same rule for one member and head as a function of (scores (..., q, k), mask, x (..., q, d)),
    the plain per-head form that tests compare against.
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int) -> None:
        super().__init__()
        self.n_members, self.n_heads, self.d_model = n_members, n_heads, d_model

    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        """Draw member ``member``'s parameters (in a fixed order, from a CPU generator)."""

    def per_row(self, value: Tensor, n_rows: int) -> Tensor:
        """(members, heads, ...) -> (members, 1, query * head, ...) matching the score rows."""
        seq = n_rows // self.n_heads
        expanded = value[:, None].expand(self.n_members, seq, *value.shape[1:])
        return expanded.reshape(self.n_members, 1, n_rows, *value.shape[2:])

    def split(self, scores: Tensor) -> Tensor:
        """(members * batch, query * head, key) -> (members, batch, query * head, key)."""
        return scores.view(self.n_members, -1, *scores.shape[-2:])

    def split_mask(self, mask: Tensor) -> Tensor:
        """The mask laid out like ``split``'s scores: a (query * head, key) mask as it is, a
        per-row (members * batch, query * head, key) one split like the scores."""
        return mask if mask.dim() == 2 else self.split(mask)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        raise NotImplementedError


RuleSpec = AttentionRule | type[ParamRule]

# What a row of weights can sum to, which decides how a rule can output "zero" (sinklab zoo,
# ``sinklab.definitions.default_source``):
# "simplex": exactly 1; "implicit sink": at most 1, the rest
# going to a key with value 0; "gated": the gate's value (softmax times a gate in (0, 1));
# "free": anything >= 0.
ROW_KINDS = ("simplex", "implicit sink", "gated", "free")
ARG_TYPES = (int, float, bool, str)  # the types a rule's keyword argument may have (or X | None)
# The largest float argument a rule takes: the model computes in float32, and a float argument
# (a sink logit's start, a bias, a temperature) that float32 cannot hold would become inf.
FLOAT32_MAX = torch.finfo(torch.float32).max  # 3.4028e38
FLOAT32_TEXT = f"{FLOAT32_MAX:.4e}".replace("e+", "e")  # "3.4028e38", for messages


@dataclass(frozen=True)
class Arg:
    """How a registration describes one keyword argument of its rule; the type and the default
    come from the rule's signature. ``check`` (optional) says whether a value of the right type
    is allowed, ``allowed`` says which ones are, in words ("a number > 0")."""

    help: str
    allowed: str = ""
    check: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class KwargSpec:
    """A rule's keyword argument: its type (int, float, bool or str, or one of them | None), its
    default, what it means, and which values it takes. None, where the type allows it, means
    what the help says and is never range-checked."""

    type: Any
    default: Any
    help: str
    allowed: str = ""
    check: Callable[[Any], bool] | None = None

    @property
    def base(self) -> type:
        """The type without None: float for ``float | None``."""
        return next(a for a in typing.get_args(self.type) if a is not type(None)) \
            if self.optional else self.type

    @property
    def optional(self) -> bool:
        return isinstance(self.type, types.UnionType)

    def words(self) -> str:
        """The allowed values in words: "a number > 0", "a finite number or none"."""
        plain = {int: "an integer", float: "a finite number", bool: "true or false",
                 str: "a string"}[self.base]
        return (self.allowed or plain) + (" or none" if self.optional else "")

    def type_text(self) -> str:
        return self.base.__name__ + (" or none" if self.optional else "")

    def validate(self, setting: str, rule: str, value: Any) -> Any:
        """``value`` if it is allowed (an int given for a float becomes a float), else a
        ValueError naming ``setting`` (e.g. ``model.attention_args.bias``) and what is allowed."""
        if value is None and self.optional:
            return None
        base, given = self.base, value
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if base is float and numeric:
            try:
                value = float(value)
            except OverflowError:
                value = math.inf  # a huge integer: refused as not finite below
        ok = (isinstance(value, bool) if base is bool
              else isinstance(value, float) and math.isfinite(value) if base is float
              else isinstance(value, int) and not isinstance(value, bool) if base is int
              else isinstance(value, str))
        name = setting.rpartition(".")[2]
        if ok and base is float and abs(value) > FLOAT32_MAX:
            bounded = f"{self.allowed or 'a finite number'} with |x| <= {FLOAT32_TEXT}"
            raise ValueError(f"{setting}={given!r} is not allowed: {rule}'s {name} must be "
                             f"{bounded}{' or none' if self.optional else ''}, the range of "
                             "the float32 the model computes in (it would overflow to inf).")
        if not ok or (self.check is not None and not self.check(value)):
            raise ValueError(f"{setting}={given!r} is not allowed: {rule}'s {name} must be "
                             f"{self.words()}.")
        return value


@dataclass(frozen=True)
class RuleInfo:
    """One registered rule: ``rule`` is the function or the ``ParamRule`` class."""

    name: str
    rule: RuleSpec
    row_kind: str
    description: str  # the docstring's first paragraph, on one line
    parameters: bool  # whether it learns parameters of its own
    kwargs: dict[str, KwargSpec] = field(default_factory=dict)
    # where it comes from: "sinklab", or the plugin that registered it (a module's dotted name,
    # or the path of a plugin file, ``sinklab.plugins``)
    module: str = "sinklab"

    def check_kwargs(self, kwargs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """``kwargs`` checked against the declaration (ints given for floats made floats); an
        unknown name, a wrong type or a value out of range is a ValueError of one sentence that
        names ``prefix + name`` and what is allowed."""
        checked = {}
        for key, value in kwargs.items():
            spec = self.kwargs.get(key)
            if spec is None:
                names = ", ".join(self.kwargs)
                takes = ("takes no keyword arguments" if not self.kwargs
                         else f"takes the keyword argument{'s' * (len(self.kwargs) > 1)} {names}")
                raise ValueError(f"{prefix}{key}={value!r} is not allowed: attention rule "
                                 f"{self.name!r} {takes}.")
            checked[key] = spec.validate(f"{prefix}{key}", self.name, value)
        return checked

    def non_default(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments whose value differs from their default."""
        return {k: v for k, v in kwargs.items()
                if k not in self.kwargs or v != self.kwargs[k].default}


RULES: dict[str, RuleInfo] = {}

# Said wherever a rule name is unknown: a rule of one's own is registered by its module.
PLUGIN_HINT = "a rule of your own needs its plugin loaded: --plugin MODULE"
PLUGIN_ATTR = "__sinklab_plugin__"  # set by sinklab.plugins on a module it loads from a file


def _origin(rule: RuleSpec) -> str:
    """Where a rule is defined: "sinklab" for sinklab's own modules, else the plugin file a
    module was loaded from (``PLUGIN_ATTR``) or the module's dotted name."""
    name = getattr(rule, "__module__", None) or "?"
    if name == "sinklab" or name.startswith("sinklab."):
        return "sinklab"
    return getattr(sys.modules.get(name), PLUGIN_ATTR, name)


def _declared_kwargs(name: str, rule: RuleSpec, docs: Mapping[str, Arg]) -> dict[str, KwargSpec]:
    """The keyword-only parameters of ``rule`` (after its fixed ones) with their types and
    defaults, joined with their descriptions; a parameter without a default, an annotation of
    another type or a description without a parameter is a TypeError (a programming error)."""
    target = rule.__init__ if isinstance(rule, type) else rule
    params = list(inspect.signature(target).parameters.values())
    # the fixed parameters: (self, n_members, n_heads, d_model), or (scores, mask)
    fixed = 4 if isinstance(rule, type) else 2
    hints = typing.get_type_hints(target)
    specs = {}
    for p in params[fixed:]:
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
            raise TypeError(f"attention rule {name!r}: parameter {p.name!r} must be keyword-only "
                            "with a default (write it after a bare *).")
        annotation = hints.get(p.name)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 \
                and args[0] in ARG_TYPES:
            annotation = args[0] | None
        elif annotation not in ARG_TYPES:
            raise TypeError(f"attention rule {name!r}: parameter {p.name!r} must be annotated "
                            "with int, float, bool or str (or one of them | None).")
        if p.name not in docs:
            raise TypeError(f"attention rule {name!r}: register it with "
                            f"kwargs={{{p.name!r}: Arg(...)}} to describe {p.name!r}.")
        doc = docs[p.name]
        specs[p.name] = KwargSpec(annotation, p.default, doc.help, doc.allowed, doc.check)
    extra = set(docs) - set(specs)
    if extra:
        raise TypeError(f"attention rule {name!r} describes {', '.join(sorted(extra))}, which "
                        "it does not take as keyword-only parameters.")
    return specs


def _first_paragraph(doc: str | None) -> str:
    paragraph = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def register(name: str, *, row_kind: str,
             kwargs: Mapping[str, Arg] | None = None) -> Callable[[RuleSpec], RuleSpec]:
    """Add a rule (a function, or a ``ParamRule`` class) to the registry under ``name``, with
    what its rows can sum to (one of ``ROW_KINDS``) and a description of each keyword
    argument it takes (see the module docstring). ``name`` must be a Python identifier (it is
    written in ``model.attention=NAME`` and in sweep cell names) that no rule has yet."""

    def add(rule: RuleSpec) -> RuleSpec:
        origin = _origin(rule)
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"attention rule name {name!r} (in {origin}) is not allowed: use "
                             "letters, digits and underscores, not starting with a digit")
        if name in RULES:
            first = RULES[name].module
            raise ValueError(f"attention rule {name!r} is already registered (by {first}); "
                             f"register the one in {origin} under another name")
        if row_kind not in ROW_KINDS:
            raise ValueError(f"attention rule {name!r}: row_kind={row_kind!r} is not one of "
                             f"{', '.join(ROW_KINDS)}")
        learned = isinstance(rule, type) and issubclass(rule, ParamRule)
        RULES[name] = RuleInfo(name, rule, row_kind, _first_paragraph(rule.__doc__), learned,
                               _declared_kwargs(name, rule, kwargs or {}), origin)
        return rule

    return add


def rule_info(name: str) -> RuleInfo:
    """A rule's registration by name; an unknown name is a ValueError listing the known ones."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown attention rule {name!r}: choose one of "
                         f"{', '.join(sorted(RULES))} ({PLUGIN_HINT})") from None


def get_rule(name: str) -> RuleSpec:
    """The rule's function or ``ParamRule`` class, by name (see ``rule_info``)."""
    return rule_info(name).rule


def has_parameters(name: str) -> bool:
    """Whether the rule learns parameters of its own."""
    return rule_info(name).parameters


class FunctionRule(nn.Module):
    """A parameter-free rule as a module: ``forward(scores, mask, x)`` ignores x and calls the
    function with the keyword arguments it was built with."""

    def __init__(self, fn: AttentionRule, **kwargs: Any) -> None:
        super().__init__()
        self.fn, self.kwargs = fn, kwargs

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        return self.fn(scores, mask, **self.kwargs)

    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        """No parameters to draw."""

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: self.fn(scores, mask, **self.kwargs)


def build_rule(name: str, n_members: int, n_heads: int, d_model: int, /,
               **kwargs: Any) -> nn.Module:
    """The rule ``name`` as a module for a layer of ``n_heads`` heads and ``n_members`` members,
    with its keyword arguments ``kwargs`` (checked: ValueError for an unknown name, a wrong type
    or a value out of range)."""
    info = rule_info(name)
    return _build(info, n_members, n_heads, d_model, info.check_kwargs(kwargs))


def _build(info: RuleInfo, n_members: int, n_heads: int, d_model: int,
           kwargs: Mapping[str, Any]) -> nn.Module:
    if info.parameters:
        return info.rule(n_members, n_heads, d_model, **kwargs)
    return FunctionRule(info.rule, **kwargs)


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """(seq_len, seq_len) boolean mask, True where key k <= query q."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


# ----------------------------------------------------------------------------- the contract

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
                rule = _build(info, n_members, n_heads, d_model, kwargs)
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
            for m, text in ((mask, given), (rows, hidden))[:2 if per_row else 1]:
                problem = _call_problem(rule, scores, m, x, text)
                if problem is not None:
                    return problem
    return None


def _call_problem(rule: nn.Module, scores: Tensor, mask: Tensor, x: Tensor, given: str
                  ) -> str | None:
    """What is wrong with one call of the rule and its backward pass, or None."""
    if scores.grad is not None:
        scores.grad = None
    try:
        weights = rule(scores, mask, x)
    except Exception as exc:
        return f"raised {first_line(exc)} when called {given}."
    problem = _weights_problem(weights, scores, mask, given)
    if problem is None and weights.requires_grad:
        try:
            weights.sum().backward()
        except Exception as exc:
            problem = f"raised {first_line(exc)} in the backward pass of a call {given}."
    return problem


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


def _visible(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Keys each row's query sees, BOS included: (rows, 1)."""
    return mask.sum(dim=-1, keepdim=True).to(dtype)


def _neg_inf_bias(mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Adding a 0 / -inf bias the size of the mask, rather than filling the scores, leaves the
    # backward pass nothing to do for the mask.
    bias = torch.zeros(mask.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~mask, float("-inf"))


def _positive(value: float) -> bool:
    return value > 0


@register("softmax", row_kind="simplex", kwargs={
    "temperature": Arg("every score is divided by it before the softmax (1: the plain rule)",
                       "a number > 0", _positive)})
def softmax(scores: Tensor, mask: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Standard softmax attention over the visible keys (Vaswani et al., 2017).

    Rows lie on the probability simplex, so a row cannot be all zero: this is what forces a sink
    in the trigger-conditional task (Ran-Milo, 2026, Theorem 1). softmax(S / temperature); the
    default temperature 1 computes exactly what it always has (and runs on the fused kernel).
    """
    if temperature != 1.0:
        scores = scores / temperature
    return (scores + _neg_inf_bias(mask, scores.dtype, scores.device)).softmax(dim=-1)


@register("relu", row_kind="free")
def relu(scores: Tensor, mask: Tensor) -> Tensor:
    """The paper's non-normalised ReLU attention: A_ik = ReLU(S_ik) / max(i, 1) for k <= i.

    The divisor is the number of non-BOS keys the query can see (i for the 0-indexed query i under
    a causal mask, whether or not key 0 is hidden from it), floored at 1 (Ran-Milo, 2026,
    Section 3 and its reference code). Rows need not sum to 1 and may be all zero, which is how
    ReLU outputs "zero" without a sink.
    """
    # the keys it sees other than key 0: i under the causal mask, BOS hidden or not
    others = mask[..., 1:].sum(dim=-1, keepdim=True).to(scores.dtype)
    scale = mask.to(scores.dtype) / others.clamp(min=1)
    return torch.relu(scores) * scale  # scale is 0 on masked keys


@register("relu_len", row_kind="free")
def relu_len(scores: Tensor, mask: Tensor) -> Tensor:
    """ReLU attention divided by the sequence length L for every query: ReLU(S_ik) / L.

    The fixed-length scaling of ReLU attention studied by Wortsman et al. (2023, "Replacing
    softmax with ReLU in vision transformers"), here with L the number of keys.
    """
    return torch.relu(scores) * (mask.to(scores.dtype) / mask.shape[-1])


@register("relu_raw", row_kind="free")
def relu_raw(scores: Tensor, mask: Tensor) -> Tensor:
    """ReLU attention with no scaling at all: ReLU(S_ik) on the visible keys (Shen et al., 2023,
    "A study on ReLU and softmax in transformer")."""
    return torch.relu(scores) * mask.to(scores.dtype)


def _sink_softmax(scores: Tensor, mask: Tensor, sink: Tensor | float) -> Tensor:
    """e^{s_k} / (e^{sink} + sum_k e^{s_k}) over the visible keys, computed stably.

    The shift m is the larger of the row's largest visible score and the sink logit, so every
    exponent is <= 0 and the sink term is e^{sink - m}: the "+1" of softmax_1 becomes e^{-m}
    after the shift, never a literal 1 added to shifted terms.
    """
    masked = scores + _neg_inf_bias(mask, scores.dtype, scores.device)
    sink = torch.as_tensor(sink, dtype=scores.dtype, device=scores.device)
    m = torch.maximum(masked.amax(dim=-1, keepdim=True), sink.expand_as(masked[..., :1]))
    m = m.detach()  # the shift cancels; no gradient needs to flow through it
    num = (masked - m).exp()
    return num / ((sink - m).exp() + num.sum(dim=-1, keepdim=True))


@register("softmax1", row_kind="implicit sink")
def softmax1(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax_1: e^{s_k} / (1 + sum_k e^{s_k}), "attention is off by one" (Miller, 2023).

    Equivalent to softmax with an extra key of logit 0 and value 0, so a row may sum to less than
    1. Stable form e^{s - m} / (e^{-m} + sum e^{s - m}) with m = max(max_k s_k, 0).
    """
    return _sink_softmax(scores, mask, 0.0)


@register("sink_logit", row_kind="implicit sink", kwargs={
    "init": Arg("the value every head's sink logit b_h starts from (0: softmax_1)")})
class SinkLogit(ParamRule):
    """Softmax with a learned per-head sink logit b_h: the logit is concatenated as an extra key,
    the softmax taken, and that column dropped, i.e. e^{s_k} / (e^{b_h} + sum_k e^{s_k}).

    The "off-by-one" key with a learned logit, as in the attention-sink literature (Xiao et al.,
    2024, learnable sink token; OpenAI gpt-oss, 2025, per-head sink logits). Initialised at
    ``init`` (default 0, where it equals softmax_1).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int, *, init: float = 0.0) -> None:
        super().__init__(n_members, n_heads, d_model)
        self.init = init
        self.logit = nn.Parameter(torch.full((n_members, n_heads), init))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.logit[member] = self.init

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        split = self.split(scores)  # (E, B, T*H, K)
        sink = self.per_row(self.logit, scores.shape[-2])[..., None]  # (E, 1, T*H, 1)
        return _sink_softmax(split, self.split_mask(mask), sink).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: _sink_softmax(scores, mask, self.logit[member, head])


@register("sigmoid", row_kind="free", kwargs={
    "bias": Arg("the bias b in sigmoid(S + b), the same for every row; none: -log n, n the "
                "keys the row sees")})
def sigmoid(scores: Tensor, mask: Tensor, *, bias: float | None = None) -> Tensor:
    """Sigmoid attention with bias -log(n): A_ik = sigmoid(S_ik - log n) (Ramapuram et al., 2025,
    "Theory, analysis, and best practices for sigmoid self-attention"), n being the number of
    keys the query sees, so that a row of equal scores starts near the mass of a softmax row.

    A fixed ``bias`` b instead gives sigmoid(S_ik + b) on every row.
    """
    if bias is None:
        return torch.sigmoid(scores - torch.log(_visible(mask, scores.dtype))) \
            * mask.to(scores.dtype)
    return torch.sigmoid(scores + bias) * mask.to(scores.dtype)


@register("softpick", row_kind="free")
def softpick(scores: Tensor, mask: Tensor) -> Tensor:
    """Softpick: ReLU(e^{s_k} - 1) / sum_k |e^{s_k} - 1| over the visible keys (Zuhri et al.,
    2025, "Softpick: no attention sink, no massive activations with rectified softmax").

    Computed after multiplying through by e^{-m}, m the row's largest visible score (at least 0):
    ReLU(e^{s-m} - e^{-m}) / sum |e^{s-m} - e^{-m}|. A row of all-zero scores is all zero.
    """
    masked = scores + _neg_inf_bias(mask, scores.dtype, scores.device)
    m = masked.amax(dim=-1, keepdim=True).clamp(min=0).detach()
    shifted = (masked - m).exp() - (-m).exp()  # e^{s-m} - e^{-m}; exactly -e^{-m} on future keys
    shifted = shifted * mask.to(scores.dtype)
    den = shifted.abs().sum(dim=-1, keepdim=True)
    tiny = torch.finfo(scores.dtype).tiny
    return torch.relu(shifted) / (den + tiny)


@register("gated", row_kind="gated")
class Gated(ParamRule):
    """Softmax attention times a per-head sigmoid output gate computed from the query token:
    A_ik = sigmoid(x_i . w_h + c_h) softmax(S_i)_k (Qiu et al., 2025, "Gated attention for large
    language models: non-linearity, sparsity, and attention-sink-free"; the gate scales the head's
    output at query i, which is the same as scaling its row of weights).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int) -> None:
        super().__init__(n_members, n_heads, d_model)
        self.gate_w = nn.Parameter(torch.zeros(n_members, n_heads, d_model))
        self.gate_b = nn.Parameter(torch.zeros(n_members, n_heads))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        draw = torch.randn(self.gate_w.shape[1:], generator=generator) * init_std
        self.gate_w[member].copy_(draw)
        self.gate_b[member] = 0.0

    def gates(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> gates (E, B, T * H, 1), rows ordered (query, head)."""
        g = torch.einsum("ebtd,ehd->ebth", x, self.gate_w) + self.gate_b[:, None, None, :]
        return torch.sigmoid(g).flatten(2)[..., None]

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        if x is None:
            raise ValueError("the gated rule needs the layer's input x for its gate")
        split = self.split(scores)
        return (softmax(split, self.split_mask(mask)) * self.gates(x)).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        def rule(scores: Tensor, mask: Tensor, x: Tensor) -> Tensor:
            gate = torch.sigmoid(x @ self.gate_w[member, head] + self.gate_b[member, head])
            return softmax(scores, mask) * gate[..., None]

        return rule


@register("uniform", row_kind="simplex")
def uniform(scores: Tensor, mask: Tensor) -> Tensor:
    """A null baseline: 1 / (number of visible keys) on every visible key, whatever the scores.

    It cannot attend selectively, so it shows what the task costs without attention."""
    weights = mask.to(scores.dtype) / _visible(mask, scores.dtype)
    return torch.zeros_like(scores) + weights
