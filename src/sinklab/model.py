"""Attention-only transformers with a leading member axis, so one module is an ensemble.

The paper's models: attention only, no MLP, no LayerNorm, no biases, no 1/sqrt(d)
scaling, no positional encoding, weights initialised N(0, 0.02^2). Every head has the full width
d_model; the output projection maps the H concatenated heads back to d_model. Multi-layer stacks
add each layer's output to the residual stream. ``model.block="standard"`` swaps each layer for a
pre-LayerNorm block with an MLP (``Block``), to ask whether the sink survives them.

Every parameter has a leading member axis (the attention weights are (n_members, n_heads,
d_model, d_model)): member e is an independent model with its own weights, and the forward pass
runs all members as one batched program. A single model is an ensemble of one. Inputs are
(members, batch, seq, d_model), or (batch, seq, d_model) shared by every member.
Row-vector convention: q = x @ W_Q, scores = q @ k^T.

Activations have the stable names of ``sinklab.hooks``, with the members axis E in front, for
layer l counted from 0:

- ``blocks.{l}.resid_pre`` (E, B, T, d): the stream entering the block;
- ``blocks.{l}.attn.scores`` (E, B, H, Q, K): q k^T before the rule (BOS hidden where
  ``model.bos`` hides it); ``blocks.{l}.attn.pattern`` (E, B, H, Q, K): the rule's weights;
- ``blocks.{l}.attn.v`` (E, B, K, H, d): head h's values x W_V^h;
- ``blocks.{l}.attn.result`` (E, B, Q, H, d): head h's output weights @ (x W_V^h) @ W_O^h,
  whose sum over heads is the attention's output;
- ``blocks.{l}.resid_post`` (E, B, T, d): the stream leaving the block (after the MLP of a
  standard block, whose attention reads LN_1 of the stream).

``forward(x, hooks=Hooks(edits, keep))`` passes each of those activations through its hooks
(a hook's return value replaces the activation for the rest of the pass) and keeps the named
ones in ``hooks.cache``; ``run_with_cache(model, x)`` keeps every one, and
``forward(x, return_weights=True)`` still lists each layer's scores and pattern. Hooks cost only
where they are: a forward pass without them runs the folded products (on the fused kernel where
it applies); a layer whose scores or pattern are wanted runs the folded products on PyTorch's
operators, laid out (E * B, Q * H, K) and shown to hooks as (E, B, H, Q, K); a layer whose values
or per-head results are wanted computes each head's products and sums them. To zero layer
0's pattern and keep the stream it leaves::

    hooks = Hooks({"blocks.0.attn.pattern": lambda w, name: w * 0}, keep=["blocks.0.resid_post"])
    model(x, hooks=hooks).out
    hooks.cache["blocks.0.resid_post"]

``model.bos`` reads the denied queries off the input (every one but BOS itself and, unless
``ablated``, the trigger's). ``removed`` and ``ablated`` take key 0 out of their rows' mask in
every layer (``key_mask``), so every rule computes those rows over the other keys, as if BOS
were not there (softmax and ReLU exactly as a -inf score at key 0 would; a rule that does not
read the scores, or reads the masked ones, as its definition says it should). ``capped`` is a
pattern hook, built by ``sinklab.first_key`` (the implementation the real-model interventions
use), that caps key 0's share at 1 - ``model.bos_cap_eps`` of the row's sum
(``first_key.cap_first_mass`` with the causal mask, ``cap_bos``), added before the user's hooks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sinklab import kernels
from sinklab.attention import build_rule, causal_mask, mix_values, seen_patterns
from sinklab.config import ModelConfig
from sinklab.first_key import cap_first, cap_first_mass
from sinklab.hooks import PER_HEAD, Hooks
from sinklab.hooks import names as activation_names
from sinklab.task import TRIGGER

ATTENTION_PARTS = ("attn.scores", "attn.pattern", *PER_HEAD)  # hooked: no fused kernel


@dataclass
class ModelOutput:
    """The stack's output (members, batch, seq, d_model) and, on request (``return_weights``),
    each layer's scores and pattern (members, batch, heads, query, key) as the pass used them."""

    out: Tensor
    patterns: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.pattern
    scores: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.scores
    # per layer, the share of each row's mixed values that a value-side rule lets through
    # (E, B, H, Q), or None where the rule scales nothing down (``ParamRule.passed``)
    passed: list[Tensor | None] = field(default_factory=list)

    def seen(self) -> list[Tensor]:
        """Each layer's pattern as its heads' outputs see it: times the share its rule's gate
        passes (``passed``), the pattern itself where nothing is scaled down. Sinks are read
        from these, so a gate that closes per dimension reads like a headwise one
        (``sinklab.attention.seen_patterns``)."""
        return seen_patterns(self.patterns, self.passed)


def _hook_rows(hooks: Hooks, name: str, rows: Tensor, n_members: int, n_heads: int) -> Tensor:
    """Apply ``name``'s hooks to scores or weights laid out (E * B, Q * H, K), rows (query,
    head), which the hooks see as (E, B, H, Q, K); the result comes back in the rows layout."""
    if not hooks.wants(name):
        return rows
    batch, seq = rows.shape[0] // n_members, rows.shape[1] // n_heads
    if n_heads == 1:  # rows (query, head) are (head, query): one view each way, not two
        return hooks(name, rows.view(n_members, batch, 1, seq, -1)).contiguous().view(rows.shape)
    seen = hooks(name, rows.view(n_members, batch, seq, n_heads, -1).transpose(2, 3))
    return seen.transpose(2, 3).contiguous().view(rows.shape)  # a view unless a hook made a copy


class Attention(nn.Module):
    """Multi-head attention with full-width heads, batched over ensemble members.

    ``layer`` names its activations (``blocks.{layer}.attn.*``, see the module docstring).
    """

    def __init__(self, n_members: int, d_model: int, n_heads: int, rule: str,
                 rule_args: dict[str, Any] | None = None, *, layer: int = 0) -> None:
        super().__init__()
        shape = (n_members, n_heads, d_model, d_model)
        self.w_q = nn.Parameter(torch.zeros(shape))
        self.w_k = nn.Parameter(torch.zeros(shape))
        self.w_v = nn.Parameter(torch.zeros(shape))
        self.w_o = nn.Parameter(torch.zeros(shape))  # head h's block of rows of W_O
        rule_args = dict(rule_args or {})  # the rule's keyword arguments (model.attention_args)
        self.rule = build_rule(rule, n_members, n_heads, d_model, **rule_args)  # .attn.rule.*
        self.rule_name, self.rule_args = rule, rule_args
        self.layer = layer
        self.names = {part: f"blocks.{layer}.{part}" for part in ATTENTION_PARTS}

    def forward(self, x: Tensor, mask: Tensor, hooks: Hooks | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x (E, B, T, d) and the keys each query sees, the causal ``mask`` (T, T) or a mask per
        row (E, B, T, T) (``AttentionStack.key_mask``) -> output (E, B, T, d), scores and
        weights (E, B, H, T, T), and the share of each row's mixed values that a value-side
        rule lets through (E, B, H, T), None for the others.

        The products are regrouped, not changed: head h's scores (x W_Q^h)(x W_K^h)^T equal
        (x A_h) x^T with A_h = W_Q^h W_K^h^T, and its output weights @ (x W_V^h) @ W_O^h equals
        weights @ (x M_h) with M_h = W_V^h W_O^h. Folding the d x d weight products first leaves
        three large products per layer instead of six small ones, and laying the scores out as
        (query, head, key) makes the sum over heads part of the last product: the heads of a
        query row are concatenated along the key axis. ``benchmarks/fast_paths.py`` measures the
        gain against the plain per-head products, and the tests compare both with the paper's
        per-head equations.

        ``hooks`` may edit or keep this layer's scores and pattern (the folded products, seen
        as (E, B, H, Q, K)) and its values and per-head results (then computed per head, as the
        equations above are written, and summed). On a CPU, softmax and ReLU layers with the
        rule's default keyword arguments and no hooks on their attention run the folded
        products on ``sinklab.kernels``' fused kernel when it is available (``engine``).

        A value-side rule (``ParamRule.value_side``: an output gate per dimension, a learned
        key and value) is given the head-space queries x W_Q^h too and always runs head by
        head, its ``mix`` between the weights @ values and W_O^h.
        """
        n_members, batch, seq, d = x.shape
        n_heads = self.w_q.shape[1]
        hooked = hooks is not None and any(map(hooks.wants, self.names.values()))
        a = self.w_q @ self.w_k.transpose(-1, -2)  # (E, H, d, d)
        per_row = mask.dim() > 2  # key 0 hidden from some rows: the kernel takes no mask
        if not hooked and not per_row and self.engine(seq, d, x.device, x.dtype) == "kernel":
            return (*kernels.FusedAttention.apply(x, a, self.w_v @ self.w_o, self.rule_name),
                    None)
        # (E, d, H*d): column block h is A_h (M_h), so one product serves every head.
        a_cat = a.transpose(1, 2).reshape(n_members, d, n_heads * d)
        flat = x.reshape(n_members, batch * seq, d)
        q = (flat @ a_cat).view(n_members * batch, seq * n_heads, d)  # rows (query, head)
        keys = x.reshape(n_members * batch, seq, d)
        # (E*B, T*H, T), rows (query, head); no 1/sqrt(d), as in the paper. The rule sees this
        # 3-d layout with a (T*H, T) mask: a 2-d mask broadcasts far faster than a (T, 1, T) one.
        scores = q @ keys.transpose(1, 2)
        if hooked:
            scores = _hook_rows(hooks, self.names["attn.scores"], scores, n_members, n_heads)
        # (T*H, T), or per row where key 0 is hidden from some queries: (E*B, T*H, T)
        row_mask = mask.repeat_interleave(n_heads, dim=-2)
        if row_mask.dim() > 2:
            row_mask = row_mask.reshape(-1, *row_mask.shape[-2:])
        value_side = self.rule.value_side
        q_head = torch.einsum("ebtd,ehdf->ebthf", x, self.w_q) if value_side else None
        own = weights = (self.rule(scores, row_mask, x, q_head) if value_side
                         else self.rule(scores, row_mask, x))
        if hooked:
            weights = _hook_rows(hooks, self.names["attn.pattern"], weights, n_members, n_heads)
        split = (n_members, batch, seq, n_heads, seq)  # (E, B, Q, H, K)
        pattern = weights.view(split).transpose(2, 3)  # (E, B, H, Q, K)
        passed = None
        if value_side:
            out, passed = self.per_head(x, pattern, hooks, own, q_head)
        elif hooked and any(hooks.wants(self.names[part]) for part in PER_HEAD):
            out, _ = self.per_head(x, pattern, hooks)
        else:
            m = self.w_v @ self.w_o
            m_cat = m.transpose(1, 2).reshape(n_members, d, n_heads * d)
            v = (flat @ m_cat).view(n_members, batch, seq, n_heads, d)
            if n_heads > 1:  # rows (head, key) to match the weights' (head, key) columns
                v = v.transpose(2, 3)
            v = v.reshape(n_members * batch, n_heads * seq, d)
            out = weights.view(n_members * batch, seq, n_heads * seq) @ v  # summed over heads
            out = out.view(n_members, batch, seq, d)
        return out, scores.view(split).transpose(2, 3), pattern, passed

    def per_head(self, x: Tensor, pattern: Tensor, hooks: Hooks | None,
                 own: Tensor | None = None, q: Tensor | None = None
                 ) -> tuple[Tensor, Tensor | None]:
        """x (E, B, T, d) and weights (E, B, H, Q, K) -> output (E, B, T, d), computed head by
        head: values x W_V^h (``attn.v``, (E, B, K, H, d)), then weights @ values, through a
        value-side rule's ``mix`` (given its own weights ``own`` and the queries ``q``), @ W_O^h
        (``attn.result``, (E, B, Q, H, d)), both through ``hooks``, summed over heads; and the
        share of each row that ``mix`` passes (E, B, H, Q), or None."""
        def hook(name: str, value: Tensor) -> Tensor:
            return value if hooks is None else hooks(self.names[name], value)

        v = hook("attn.v", torch.einsum("ebkd,ehdf->ebkhf", x, self.w_v))
        mixed = torch.einsum("ebhqk,ebkhf->ebqhf", pattern, v)  # (E, B, Q, H, d)
        passed = None
        if own is not None and q is not None:  # the value side, as every model applies it
            rows = own.view(*mixed.shape[:-1], -1).transpose(2, 3)  # (E, B, H, Q, K)
            mixed, passed = mix_values(self.rule, mixed.transpose(2, 3), rows, x,
                                       q.transpose(2, 3))
            mixed = mixed.transpose(2, 3)  # (E, B, Q, H, d)
        result = hook("attn.result", torch.einsum("ebqhf,ehfg->ebqhg", mixed, self.w_o))
        return result.sum(dim=3), passed

    def engine(self, seq_len: int, d_model: int, device: torch.device,
               dtype: torch.dtype = torch.float32) -> str:
        """``"kernel"`` or ``"pytorch"``: what computes this layer without hooks on its
        attention (``sinklab.kernels``)."""
        return kernels.engine(self.rule_name, seq_len, d_model, device, dtype, self.rule_args)


def cap_bos(weights: Tensor, rows: Tensor, mask: Tensor, eps: float) -> Tensor:
    """``model.bos="capped"``'s cap: the BOS share of the selected ``rows`` limited to 1 - eps,
    each row keeping its sum (``first_key.cap_first`` with the causal ``mask`` as the visible
    keys and eps S rounded as ``"product"``).

    At a selected row with sum S whose BOS weight w_0 exceeds (1 - eps) S, BOS gets (1 - eps) S
    and the other visible keys share eps S in proportion to their weights (equally, if they all
    had weight 0). Rows with sum 0 (a ReLU row that outputs zero) are left alone.
    ``weights`` (..., rows, keys), ``rows`` a boolean mask broadcasting to (..., rows), ``mask``
    the (rows, keys) causal mask the rule was given.
    """
    return cap_first(weights, eps, rows, visible=mask, excess="product")


class LayerNorm(nn.Module):
    """LayerNorm over d_model with a gain and a bias per member, initialised to 1 and 0."""

    def __init__(self, n_members: int, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n_members, d_model))
        self.bias = nn.Parameter(torch.zeros(n_members, d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> normalised over d, then scaled and shifted per member."""
        normed = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return normed * self.gain[:, None, None] + self.bias[:, None, None]


MLP_RATIO = 4  # hidden width of the standard block's MLP, in units of d_model


class MLP(nn.Module):
    """The standard block's position-wise MLP, d -> 4d -> d with GELU, batched over members."""

    def __init__(self, n_members: int, d_model: int) -> None:
        super().__init__()
        hidden = MLP_RATIO * d_model
        self.w_in = nn.Parameter(torch.zeros(n_members, d_model, hidden))
        self.b_in = nn.Parameter(torch.zeros(n_members, hidden))
        self.w_out = nn.Parameter(torch.zeros(n_members, hidden, d_model))
        self.b_out = nn.Parameter(torch.zeros(n_members, d_model))

    def forward(self, x: Tensor) -> Tensor:
        n_members, batch, seq, d = x.shape
        flat = x.reshape(n_members, batch * seq, d)
        hidden = nn.functional.gelu(torch.baddbmm(self.b_in[:, None], flat, self.w_in))
        out = torch.baddbmm(self.b_out[:, None], hidden, self.w_out)
        return out.view(n_members, batch, seq, d)


class Block(nn.Module):
    """One layer of the stack, layer ``layer`` (``blocks.{layer}.*``).

    ``model.block="attention"`` (the paper): x <- x + MHA(x) with a residual stream, else
    x <- MHA(x). ``"standard"`` (pre-LayerNorm, always residual): x <- x + MHA(LN_1(x)), then
    x <- x + MLP(LN_2(x)). The gated rule's gate reads the attention's input, LN_1(x) here.
    """

    def __init__(self, cfg: ModelConfig, n_members: int, d_model: int, residual: bool,
                 layer: int = 0) -> None:
        super().__init__()
        self.residual = residual
        self.resid_pre = f"blocks.{layer}.resid_pre"  # the names of the stream around it
        self.resid_post = f"blocks.{layer}.resid_post"
        self.attn = Attention(n_members, d_model, cfg.n_heads, cfg.attention,
                              cfg.attention_args, layer=layer)
        self.standard = cfg.block == "standard"
        if self.standard:
            self.norm1 = LayerNorm(n_members, d_model)
            self.norm2 = LayerNorm(n_members, d_model)
            self.mlp = MLP(n_members, d_model)

    def forward(self, h: Tensor, mask: Tensor, hooks: Hooks | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """h (E, B, T, d) -> the new stream, and the attention's scores, weights and passed
        shares (``Attention.forward``)."""
        if hooks is not None:
            h = hooks(self.resid_pre, h)
        y, scores, weights, passed = self.attn(self.norm1(h) if self.standard else h, mask,
                                               hooks)
        h = h + y if self.residual else y
        if self.standard:
            h = h + self.mlp(self.norm2(h))
        if hooks is not None:
            h = hooks(self.resid_post, h)
        return h, scores, weights, passed


class AttentionStack(nn.Module):
    """n_layers attention layers; residual stacks compute x <- x + MHA_l(x) for each layer."""

    def __init__(self, cfg: ModelConfig, d_model: int, *, residual: bool, n_members: int = 1):
        super().__init__()
        self.cfg = cfg
        self.d_model = d_model
        self.residual = residual
        self.n_members = n_members
        self.blocks = nn.ModuleList(Block(cfg, n_members, d_model, residual, layer)
                                    for layer in range(cfg.n_layers))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Draw member ``member``'s weights from N(0, init_std^2) with a CPU ``generator``.

        The draw order (layer by layer: W_Q, W_K, W_V, W_O, then the rule's parameters, then a
        standard block's MLP weights W_in, W_out) is fixed, so a member initialised with a given
        generator state is the same whatever ensemble it sits in, on any device. MLP biases and
        LayerNorm shifts start at 0, LayerNorm gains at 1.
        """
        def draw(p: Tensor) -> None:
            p[member].copy_(torch.randn(p.shape[1:], generator=generator) * self.cfg.init_std)

        for block in self.blocks:
            for p in (block.attn.w_q, block.attn.w_k, block.attn.w_v, block.attn.w_o):
                draw(p)
            block.attn.rule.init_member(member, generator, self.cfg.init_std)
            if block.standard:
                draw(block.mlp.w_in)
                draw(block.mlp.w_out)
                block.mlp.b_in[member] = 0.0
                block.mlp.b_out[member] = 0.0
                for norm in (block.norm1, block.norm2):
                    norm.gain[member] = 1.0
                    norm.bias[member] = 0.0

    def engine(self, seq_len: int) -> str:
        """``"kernel"`` when every layer's attention runs on ``sinklab.kernels``' fused kernel
        for sequences of ``seq_len`` tokens (on this model's device) in a forward pass without
        hooks, else ``"pytorch"``. A hidden or capped BOS key is a hook on every layer's scores
        or pattern, which the kernel does not expose."""
        if self.cfg.bos != "visible":
            return "pytorch"
        weight = next(self.parameters())
        engines = {b.attn.engine(seq_len, self.d_model, weight.device, weight.dtype)
                   for b in self.blocks}
        return "kernel" if engines == {"kernel"} else "pytorch"

    def denied(self, x: Tensor) -> Tensor:
        """The queries ``model.bos`` denies BOS to, flagged in the input x (E, B, T, d): every
        one but BOS itself and, unless ``ablated``, the trigger's. (E, B, T) booleans."""
        denied = (x[..., TRIGGER] == 0) | (self.cfg.bos == "ablated")
        denied[..., 0] = False
        return denied

    def key_mask(self, x: Tensor, mask: Tensor) -> Tensor:
        """The keys every layer's rule is given: the causal ``mask`` (T, T) where BOS is visible
        or capped, and for ``removed`` and ``ablated`` that mask with key 0 taken out of the
        denied queries' rows, (E, B, T, T)."""
        if self.cfg.bos not in ("removed", "ablated"):
            return mask
        keys = mask.expand(*x.shape[:2], *mask.shape).clone()
        keys[..., 0] &= ~self.denied(x)
        return keys

    def bos_hooks(self, x: Tensor, mask: Tensor) -> Hooks | None:
        """The hooks that carry out ``model.bos="capped"`` on the input x (E, B, T, d): a cap
        on key 0's share of every layer's pattern at the denied queries
        (``first_key.cap_first_mass``, as ``cap_bos``); None for the other modes (``removed``
        and ``ablated`` are the rules' mask, ``key_mask``)."""
        if self.cfg.bos != "capped":
            return None
        rows = self.denied(x)[:, :, None]  # (E, B, 1, Q): every head alike
        return cap_first_mass(self.cfg.bos_cap_eps, len(self.blocks), rows=rows,
                              visible=mask, excess="product")

    def forward(self, x: Tensor, *, return_weights: bool = False,
                hooks: Hooks | None = None) -> ModelOutput:
        """x (E, B, T, d) or (B, T, d) shared by all members -> ModelOutput, out (E, B, T, d).

        ``hooks`` edit and keep activations by name (the module docstring); their names must be
        this model's (a ValueError of one sentence if not), and what they keep is in
        ``hooks.cache`` afterwards. ``model.bos``'s cap (``bos_hooks``) runs before them.
        """
        if x.dim() == 3:
            x = x.expand(self.n_members, *x.shape)
        mask = causal_mask(x.shape[-2], x.device)
        if hooks is not None:
            hooks.check(len(self.blocks))
            if hooks.empty:
                hooks = None  # nothing to do: the plain forward pass
        run = self.bos_hooks(x, mask)
        if hooks is not None:
            run = hooks if run is None else run.merged(hooks)
        keys = self.key_mask(x, mask)
        result = ModelOutput(out=x)
        h = x
        for block in self.blocks:
            h, scores, weights, passed = block(h, keys, run)
            if return_weights:
                result.scores.append(scores)
                result.patterns.append(weights)
                result.passed.append(passed)
        if hooks is not None and run is not hooks:
            hooks.cache.update(run.cache)
        result.out = h
        return result


def run_with_cache(model: AttentionStack, x: Tensor,
                   names: Iterable[str] | None = None) -> tuple[ModelOutput, dict[str, Tensor]]:
    """The model's forward pass on x, and the activations ``names`` (default: every one) as it
    computed them, detached, by name. A name the model does not have is a ValueError."""
    keep = activation_names(len(model.blocks)) if names is None else list(names)
    hooks = Hooks(keep=keep)
    out = model(x, hooks=hooks)
    return out, hooks.cache
