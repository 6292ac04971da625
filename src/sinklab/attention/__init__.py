"""Attention rules: from raw scores plus a causal mask to attention weights.

The face of the package; importing it registers sinklab's own rules, in the order ``RULES``
lists them. ``registry`` declares, registers, looks up and builds rules (its docstring is the
interface a rule keeps), ``rules`` holds sinklab's own, ``contract`` checks a rule where it is
used, and ``apply`` is how a rule's weights reach each head's output in every model::

    from sinklab.attention import RULES, build_rule, causal_mask, register, rule_info
    rule = build_rule("relu", 1, 2, 16)  # members, heads, d_model
    weights = rule(scores, causal_mask(seq_len), x)
"""

from sinklab.attention.apply import mix_values, seen_patterns
from sinklab.attention.contract import (
    CONTRACT_D_MODEL,
    CONTRACT_LAYERS,
    ContractError,
    check_contract,
    first_line,
)
from sinklab.attention.registry import (
    ARG_TYPES,
    FLOAT32_MAX,
    FLOAT32_TEXT,
    PLUGIN_ATTR,
    PLUGIN_HINT,
    ROW_KINDS,
    RULES,
    Arg,
    AttentionRule,
    FunctionRule,
    KwargSpec,
    ParamRule,
    RuleInfo,
    RuleSpec,
    build_checked,
    build_rule,
    causal_mask,
    get_rule,
    has_parameters,
    register,
    rule_info,
    takes_d_head,
)
from sinklab.attention.rules import (  # registers them, in this order
    Gated,
    GatedDim,
    KVBias,
    SinkLogit,
    clipped_softmax,
    mixed_share,
    relu,
    relu_len,
    relu_raw,
    sigmoid,
    softmax,
    softmax1,
    softpick,
    uniform,
)

__all__ = [
    "ARG_TYPES", "CONTRACT_D_MODEL", "CONTRACT_LAYERS", "FLOAT32_MAX", "FLOAT32_TEXT",
    "PLUGIN_ATTR", "PLUGIN_HINT", "ROW_KINDS", "RULES", "Arg", "AttentionRule", "ContractError",
    "FunctionRule", "Gated", "GatedDim", "KVBias", "KwargSpec", "ParamRule", "RuleInfo",
    "RuleSpec", "SinkLogit", "build_checked", "build_rule", "causal_mask", "check_contract",
    "clipped_softmax", "first_line", "get_rule", "has_parameters", "mix_values", "mixed_share",
    "register", "relu", "relu_len", "relu_raw", "rule_info", "seen_patterns", "sigmoid", "softmax",
    "softmax1", "softpick", "takes_d_head", "uniform",
]
