"""Stable activation names, and hooks that read or edit them during a forward pass.

The toy models (``sinklab.model``) and real Hugging Face models (``sinklab.lm.capture``) name
their activations in the interpretability field's vocabulary (TransformerLens's, without the
``hook_`` prefix), layer ``l`` counted from 0:

- ``blocks.{l}.resid_pre``: the residual stream entering layer l;
- ``blocks.{l}.attn.scores``: the attention scores before the rule (softmax ...), masked keys
  included;
- ``blocks.{l}.attn.pattern``: the attention weights;
- ``blocks.{l}.attn.v``: each head's value vectors;
- ``blocks.{l}.attn.result``: each head's output, after its block of the output projection, so
  that the layer's attention output is their sum (plus a bias where the model has one);
- ``blocks.{l}.resid_post``: the residual stream leaving layer l.

Shapes (a toy model adds a leading members axis ``E``): scores and pattern (B, H, Q, K); v
(B, K, H, d_head); result (B, Q, H, d_model); resid (B, T, d_model). A hook is a function
``hook(tensor, name) -> tensor or None``: what it returns replaces the activation for the rest
of the forward pass (None leaves it as it is). ``Hooks`` holds the hooks and the names to keep
for one forward pass::

    hooks = Hooks({"blocks.0.attn.pattern": cap}, keep=["blocks.0.resid_post"])
    model(x, hooks=hooks)
    hooks.cache["blocks.0.resid_post"]

``on_layers(part, hook, n_layers)`` puts one hook on ``blocks.{l}.{part}`` of every layer (or of
the layers asked for).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

Hook = Callable[[Tensor, str], "Tensor | None"]

LAYER_NAMES = ("resid_pre", "attn.scores", "attn.pattern", "attn.v", "attn.result",
               "resid_post")
PER_HEAD = ("attn.v", "attn.result")  # names that need a layer's per-head products
_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def names(n_layers: int) -> list[str]:
    """Every activation name of a model with ``n_layers`` layers, in forward order."""
    return [f"blocks.{layer}.{part}" for layer in range(n_layers) for part in LAYER_NAMES]


def split(name: str) -> tuple[int, str]:
    """``"blocks.3.attn.v"`` -> (3, ``"attn.v"``); a name of another form is a ValueError."""
    match = _NAME.fullmatch(name)
    if match is None or match.group(2) not in LAYER_NAMES:
        raise ValueError(f"{name!r} is not an activation name: names are blocks.L.PART with "
                         f"PART one of {', '.join(LAYER_NAMES)}.")
    return int(match.group(1)), match.group(2)


def check_names(given: Iterable[str], n_layers: int) -> list[str]:
    """The names, checked against a model of ``n_layers`` layers (one sentence if not)."""
    out = []
    for name in given:
        layer, _ = split(name)
        if layer >= n_layers:
            raise ValueError(f"{name!r} names layer {layer}, but the model has layers 0 to "
                             f"{n_layers - 1}.")
        out.append(name)
    return out


@dataclass
class Hooks:
    """The hooks and kept names of one forward pass, and what it kept (``cache``).

    ``edits`` maps a name to a hook or a list of hooks (applied in order); ``keep`` lists the
    names whose (edited) value goes into ``cache``, detached. ``cache`` is filled by the forward
    pass: a name's tensor, as the rest of the pass saw it.
    """

    edits: Mapping[str, Hook | Sequence[Hook]] = field(default_factory=dict)
    keep: Iterable[str] = ()
    cache: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.edits = {name: list(h) if isinstance(h, (list, tuple)) else [h]
                      for name, h in self.edits.items()}
        self.keep = set(self.keep)
        for name in [*self.edits, *self.keep]:
            split(name)

    @property
    def empty(self) -> bool:
        """Whether these hooks neither edit nor keep anything (a forward pass with them is the
        plain one)."""
        return not self.edits and not self.keep

    def check(self, n_layers: int) -> None:
        """Every name must be one of a model of ``n_layers`` layers."""
        check_names([*self.edits, *self.keep], n_layers)

    def wants(self, name: str) -> bool:
        """Whether the forward pass must produce ``name`` (to edit or to keep it)."""
        return name in self.edits or name in self.keep

    def wants_layer(self, layer: int, parts: Iterable[str] = LAYER_NAMES) -> bool:
        return any(self.wants(f"blocks.{layer}.{p}") for p in parts)

    def __call__(self, name: str, tensor: Tensor) -> Tensor:
        """Apply ``name``'s hooks to ``tensor`` and keep the result if asked."""
        for hook in self.edits.get(name, ()):
            edited = hook(tensor, name)
            if edited is not None:
                if edited.shape != tensor.shape:
                    raise ValueError(f"a hook on {name} returned shape {tuple(edited.shape)} "
                                     f"for an activation of shape {tuple(tensor.shape)}.")
                tensor = edited
        if name in self.keep:
            self.cache[name] = tensor.detach()
        return tensor

    def merged(self, other: Hooks) -> Hooks:
        """These hooks, then ``other``'s, and both kept sets (a new, empty cache)."""
        edits = {name: list(hooks) for name, hooks in self.edits.items()}
        for name, hooks in other.edits.items():
            edits.setdefault(name, []).extend(hooks)
        return Hooks(edits, set(self.keep) | set(other.keep))


def on_layers(part: str, hook: Hook, n_layers: int, layers: Iterable[int] | None = None
              ) -> Hooks:
    """``hook`` on ``blocks.{l}.{part}`` for each of ``layers`` (None: all ``n_layers``)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, not {n_layers!r}.")
    chosen = list(range(n_layers)) if layers is None else list(layers)
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer!r} is not a layer of the model: layers are 0 to "
                             f"{n_layers - 1}.")
    return Hooks({f"blocks.{layer}.{part}": hook for layer in chosen})
