"""Attention rules: from raw scores plus a causal mask to attention weights.

A rule takes ``scores`` of shape (..., q, k) and a boolean ``mask`` that broadcasts against them,
True where query q may see key k, and returns weights of the same shape as ``scores`` with exactly
0 on every masked key. The key axis is always last. The model passes scores laid out
(members * batch, query * head, key), rows ordered (query, head), with the matching
(query * head, key) causal mask, or, where some rows may not see key 0 (``model.bos``
"removed" or "ablated": BOS taken out of those rows' keys, whatever the rule does with its
keys), a (members * batch, query * head, key) mask: a rule must not assume that a row's index is
its query position, nor that every row sees key 0.

A rule that acts past its weights, on each head's mixed values or output (an output gate per
dimension, a learned key with its own value), is a ``ParamRule`` with ``value_side = True``. The
layer then also hands it the head-space queries q = x W_Q^h (members, batch, query, head, d) and,
after mixing, calls ``rule.mix(mixed, weights, x, q)`` on each head's mixed values weights @
(x W_V^h), (members, batch, query, head, d), before W_O^h; ``rule.passed(mixed, mixed_out)``,
given those values before and after ``mix``, says per row how much of them ``mix`` lets through
(the share a gate passes), so that measurements read the weights as the head's output sees them
(``sinklab.model``).

A rule is registered once, with its metadata: ``@register("name", row_kind=..., kwargs=...)``
records a ``RuleInfo`` (``rule_info(name)``): the function or class, what a row of its weights
can sum to, its description (the docstring's first paragraph), whether it learns parameters,
and its keyword arguments. Most rules are plain functions. A rule with parameters (a learned sink
logit, an output gate) is an ``nn.Module`` subclass of ``ParamRule``, registered the same way; it
owns its parameters with a leading member axis, like the model's weights, and also sees the
layer's input (for a gate computed from the query token).

The toy models' heads are d_model wide; the language models of ``sinklab pretrain`` split
d_model into heads d_head = d_model / n_heads wide. A ``ParamRule`` whose parameters act on a
head's queries or values (a learned key, a gate per dimension) takes ``d_head`` after
``d_model`` (``__init__(self, n_members, n_heads, d_model, d_head=None, *, ...)``, None meaning
as wide as d_model) and sizes them by it; a ``ParamRule`` without that parameter is refused, in
one sentence, by a model whose heads are narrower than d_model.

A rule's keyword arguments are the keyword-only parameters of the function after
``(scores, mask)``, or of the class's constructor after ``(n_members, n_heads, d_model)`` (and
``d_head``): their types and defaults are read off the signature, their meaning and allowed
values from the registration's ``Arg``. ``build_rule`` checks them and turns either kind into
a module, which the attention layer builds once::

    rule = build_rule("relu", 1, 2, 16)  # members, heads, d_model
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

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__()
        self.n_members, self.n_heads, self.d_model = n_members, n_heads, d_model
        self.d_head = d_head or d_model  # each head's query and value width

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

    def head(self, member: int, head: int) -> Callable[..., Tensor]:
        raise NotImplementedError

    # A value-side rule (module docstring): forward also takes the head-space queries q, and
    # ``mix`` and ``passed`` act on each head's mixed values.
    value_side: typing.ClassVar[bool] = False

    def mix(self, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor) -> Tensor:
        """Each head's mixed values (E, B, Q, H, d) -> what W_O^h receives; ``weights`` are the
        rule's own (E * B, Q * H, K), before any hook. The identity unless ``value_side``."""
        return mixed

    def passed(self, mixed: Tensor, mixed_out: Tensor) -> Tensor | None:
        """The share of each row's mixed values that ``mix`` lets through, (E, B, Q, H), from
        the values before (``mixed``) and after it (``mixed_out``), or None where ``mix`` scales
        nothing down."""
        return None


def mixed_share(before: Tensor, after: Tensor) -> Tensor:
    """|after| / |before| over the last axis (a head's mixed values), 1 where ``before`` is 0:
    the share of a row's output that an edit lets through."""
    num, den = after.norm(dim=-1), before.norm(dim=-1)
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(den.dtype).tiny),
                       torch.ones_like(den))


RuleSpec = AttentionRule | type[ParamRule]

# What a row of weights can sum to, which decides how a rule can output "zero" (sinklab zoo,
# ``sinklab.definitions.default_source``):
# "simplex": exactly 1; "implicit sink": at most 1, the rest
# going to a key with value 0; "gated": the gate's value (softmax times a gate in (0, 1));
# "free": anything >= 0; "learned key": at most 1, the rest going to a learned key whose value is
# learned too; "clipped": anything >= 0, entries clipped to [0, 1] (a softmax's small entries
# become exactly 0).
ROW_KINDS = ("simplex", "implicit sink", "gated", "free", "learned key", "clipped")
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
    if isinstance(rule, type) and len(params) > fixed and params[fixed].name == "d_head":
        fixed += 1  # a rule whose head width may differ from d_model (``takes_d_head``)
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

    value_side = False  # as a ParamRule that acts only through its weights

    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        """No parameters to draw."""

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: self.fn(scores, mask, **self.kwargs)


def build_rule(name: str, n_members: int, n_heads: int, d_model: int,
               d_head: int | None = None, /, **kwargs: Any) -> nn.Module:
    """The rule ``name`` as a module for a layer of ``n_heads`` heads and ``n_members`` members,
    with its keyword arguments ``kwargs`` (checked: ValueError for an unknown name, a wrong type
    or a value out of range). ``d_head`` is the width of each head's queries and values where
    it differs from ``d_model`` (the language models' heads, d_model / n_heads wide): a rule with
    parameters of the heads' width must take it (``takes_d_head``), else it is a ValueError."""
    info = rule_info(name)
    return _build(info, n_members, n_heads, d_model, info.check_kwargs(kwargs), d_head)


def takes_d_head(rule: RuleSpec) -> bool:
    """Whether a ``ParamRule`` class takes the heads' width ``d_head`` after ``d_model`` (its
    parameters that act on queries or values are that wide); function rules need no width."""
    if not isinstance(rule, type):
        return True
    params = list(inspect.signature(rule.__init__).parameters)
    return len(params) > 4 and params[4] == "d_head"


def _build(info: RuleInfo, n_members: int, n_heads: int, d_model: int,
           kwargs: Mapping[str, Any], d_head: int | None = None) -> nn.Module:
    if not info.parameters:
        return FunctionRule(info.rule, **kwargs)
    if takes_d_head(info.rule):
        return info.rule(n_members, n_heads, d_model, d_head or d_model, **kwargs)
    if d_head not in (None, d_model):
        where = "sinklab" if info.module == "sinklab" else f"plugin {info.module}"
        raise ValueError(f"attention rule {info.name!r} (from {where}) learns parameters but "
                         f"takes no d_head, so it needs heads as wide as the model "
                         f"(d_model {d_model}), not {d_head} wide: give its __init__ a "
                         "d_head parameter after d_model.")
    return info.rule(n_members, n_heads, d_model, **kwargs)


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

    def __init__(self, n_members: int, n_heads: int, d_model: int, d_head: int | None = None,
                 *, init: float = 0.0) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
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

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
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


def _at_most_zero(value: float) -> bool:
    return value <= 0


def _at_least_one(value: float) -> bool:
    return value >= 1


@register("clipped_softmax", row_kind="clipped", kwargs={
    "zeta": Arg("the stretch's top: a weight reaches 1 where the softmax reaches "
                "(1 - gamma) / (zeta - gamma) (1: never before the softmax's own 1)",
                "a number >= 1", _at_least_one),
    "gamma": Arg("the stretch's bottom: a softmax weight at or below -gamma / (zeta - gamma) "
                 "becomes exactly 0 (0 with zeta 1: plain softmax)", "a number <= 0",
                 _at_most_zero)})
def clipped_softmax(scores: Tensor, mask: Tensor, *, zeta: float = 1.0,
                    gamma: float = -0.03) -> Tensor:
    """Clipped softmax: clip((zeta - gamma) softmax(S)_k + gamma, 0, 1) on the visible keys
    (Bondarenko et al., 2023, "Quantizable transformers: removing outliers by helping attention
    heads do nothing").

    A softmax weight at or below -gamma / (zeta - gamma) becomes exactly 0 with a finite score,
    so a head can put exactly nothing on its other keys while it sinks. A row of n keys is all
    zero only when every softmax weight is that small, which needs n >= (zeta - gamma) / -gamma
    (35 keys at the defaults, more than the paper's 16-token rows have). zeta = 1, gamma = 0 is
    softmax.
    """
    p = softmax(scores, mask)
    return ((zeta - gamma) * p + gamma).clamp(0.0, 1.0) * mask.to(scores.dtype)


@register("kv_bias", row_kind="learned key")
class KVBias(ParamRule):
    """Softmax over the keys and one learned key k_h with a learned value v_h per head: the row
    puts e^{q.k_h} / (e^{q.k_h} + sum_k e^{s_k}) on the learned key and the head outputs that
    weight times v_h besides its other values (a learnable key/value bias, Sun et al., 2024,
    "Massive activations in large language models"; Gu et al., 2025, "When attention sink
    emerges in language models").

    q = x_i W_Q^h is the head's query, scored against k_h like any key (no 1/sqrt(d), as every
    score here). The weights over the sequence's keys sum to 1 minus the learned key's; with
    v_h = 0 the learned key is a sink logit that depends on the query. k_h and v_h start from
    N(0, init_std^2), like the layer's weights.
    """

    value_side = True

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
        self.key = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))
        self.value = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        for p in (self.key, self.value):
            p[member].copy_(torch.randn(p.shape[1:], generator=generator) * init_std)

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None,
                q: Tensor | None = None) -> Tensor:
        if q is None:
            raise ValueError("the kv_bias rule needs the head's queries q to score its key")
        extra = torch.einsum("ebthd,ehd->ebth", q, self.key).flatten(2)[..., None]
        split = self.split(scores)  # (E, B, T*H, K); extra (E, B, T*H, 1)
        return _sink_softmax(split, self.split_mask(mask), extra).view_as(scores)

    def mix(self, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor) -> Tensor:
        """Each head's mixed values plus the learned key's weight (1 minus the row's sum, the
        softmax's remainder) times v_h."""
        rest = 1 - weights.view(*mixed.shape[:-1], -1).sum(-1, keepdim=True)  # (E, B, Q, H, 1)
        return mixed + rest * self.value[:, None, None]

    def head(self, member: int, head: int) -> Callable[..., Tensor]:
        def rule(scores: Tensor, mask: Tensor, x: Tensor | None = None,
                 q: Tensor | None = None) -> Tensor:
            if q is None:
                raise ValueError("the kv_bias rule needs the head's queries q to score its key")
            return _sink_softmax(scores, mask, (q @ self.key[member, head])[..., None])

        return rule


@register("gated_dim", row_kind="gated")
class GatedDim(ParamRule):
    """Softmax attention whose head output is gated per dimension by the query token:
    o_i = sigmoid(x_i W_g^h + b_g^h) * (softmax(S_i) x W_V^h), elementwise, before W_O^h (Qiu et
    al., 2025, "Gated attention for large language models", their G1 gate; ``gated`` is its
    headwise form, one gate per head).

    The weights are plain softmax; the gate acts on the head's mixed values, so a row's share of
    its output that the gate passes (``passed``) is what reads as its sum where sinks are
    measured. W_g^h (d_model x d_head) starts from N(0, init_std^2) and b_g^h at 0 (gates near 1/2).
    """

    value_side = True

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
        self.gate_w = nn.Parameter(torch.zeros(n_members, n_heads, d_model, self.d_head))
        self.gate_b = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.gate_w[member].copy_(torch.randn(self.gate_w.shape[1:], generator=generator)
                                  * init_std)
        self.gate_b[member] = 0.0

    def gates(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> each head's gate per dimension (E, B, T, H, d)."""
        g = torch.einsum("ebtd,ehdf->ebthf", x, self.gate_w) + self.gate_b[:, None, None]
        return torch.sigmoid(g)

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None,
                q: Tensor | None = None) -> Tensor:
        return softmax(scores, mask)

    def mix(self, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor) -> Tensor:
        return mixed * self.gates(x)

    def passed(self, mixed: Tensor, mixed_out: Tensor) -> Tensor:
        """|gate * mixed| / |mixed| per row and head: the gate itself where it is the same on
        every dimension."""
        return mixed_share(mixed, mixed_out)

    def head(self, member: int, head: int) -> Callable[..., Tensor]:
        return lambda scores, mask, x=None, q=None: softmax(scores, mask)
