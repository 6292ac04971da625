"""The registry of attention rules: how a rule is declared, registered, looked up and built.

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
(``sinklab.attention.apply``, which both models call).

A rule is registered once, with its metadata: ``@register("name", row_kind=..., kwargs=...)``
records a ``RuleInfo`` (``rule_info(name)``): the function or class, what a row of its weights
can sum to, its description (the docstring's first paragraph), whether it learns parameters,
its keyword arguments, and the facts other modules ask of it (the fused kernel's code for the
rule, whether a row of zero scores gives a row of zero weights, whether its weights ignore the
scores). Most rules are plain functions. A rule with parameters (a learned sink logit, an
output gate) is an ``nn.Module`` subclass of ``ParamRule``, registered the same way; it owns its
parameters with a leading member axis, like the model's weights, and also sees the layer's input
(for a gate computed from the query token).

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

A rule of your own is registered the same way from a module outside sinklab, a plugin
(``sinklab.plugins``: ``--plugin MODULE`` on the command line, or an entry point of the group
``sinklab.rules``); ``RuleInfo.module`` records where each rule comes from (``"sinklab"`` for
sinklab's own, ``sinklab.attention.rules``). A name can be registered once: a second
registration is a ValueError naming the first.
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
    # the code ``sinklab.kernels``' fused kernel computes the rule by (at its default keyword
    # arguments), None for a rule the kernel does not know
    kernel_code: int | None = None
    # whether a row of scores that are all 0 gives a row of weights that are all exactly 0 (the
    # ReLU family, softpick): a head can output zero with no key to sink on
    zero_row: bool = False
    # whether its weights ignore the scores (uniform): a layer of it is linear in its input
    fixed_weights: bool = False

    @property
    def sums_to_one(self) -> bool:
        """Whether every row of its weights sums to exactly 1 (``row_kind`` "simplex")."""
        return self.row_kind == "simplex"

    @property
    def extra_key(self) -> bool:
        """Whether the rest of a row (1 minus its sum) goes to a key outside the sequence, an
        implicit sink or a learned key (``row_kind`` "implicit sink" or "learned key")."""
        return self.row_kind in ("implicit sink", "learned key")

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


def register(name: str, *, row_kind: str, kwargs: Mapping[str, Arg] | None = None,
             kernel_code: int | None = None, zero_row: bool = False,
             fixed_weights: bool = False) -> Callable[[RuleSpec], RuleSpec]:
    """Add a rule (a function, or a ``ParamRule`` class) to the registry under ``name``, with
    what its rows can sum to (one of ``ROW_KINDS``), a description of each keyword argument it
    takes (see the module docstring) and the facts ``RuleInfo`` records (``kernel_code`` for
    sinklab's own rules only). ``name`` must be a Python identifier (it is written in
    ``model.attention=NAME`` and in sweep cell names) that no rule has yet."""

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
        if kernel_code is not None and origin != "sinklab":
            raise ValueError(f"attention rule {name!r} (in {origin}): kernel_code is for the "
                             "rules sinklab's own kernel computes (sinklab.kernels)")
        learned = isinstance(rule, type) and issubclass(rule, ParamRule)
        RULES[name] = RuleInfo(name, rule, row_kind, _first_paragraph(rule.__doc__), learned,
                               _declared_kwargs(name, rule, kwargs or {}), origin,
                               kernel_code=kernel_code, zero_row=zero_row,
                               fixed_weights=fixed_weights)
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
    return build_checked(info, n_members, n_heads, d_model, info.check_kwargs(kwargs),
                         d_head)


def takes_d_head(rule: RuleSpec) -> bool:
    """Whether a ``ParamRule`` class takes the heads' width ``d_head`` after ``d_model`` (its
    parameters that act on queries or values are that wide); function rules need no width."""
    if not isinstance(rule, type):
        return True
    params = list(inspect.signature(rule.__init__).parameters)
    return len(params) > 4 and params[4] == "d_head"


def build_checked(info: RuleInfo, n_members: int, n_heads: int, d_model: int,
                  kwargs: Mapping[str, Any], d_head: int | None = None) -> nn.Module:
    """``build_rule`` for a registration ``info`` whose keyword arguments ``kwargs`` are
    checked already (``RuleInfo.check_kwargs``)."""
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
