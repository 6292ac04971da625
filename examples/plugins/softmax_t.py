"""An attention rule of your own, as a plugin: softmax at a temperature t.

    sinklab rules --plugin examples/plugins/softmax_t.py
    sinklab train --plugin examples/plugins/softmax_t.py model.attention=softmax_t \
        model.attention_args.t=2 --out runs/t2

A plugin is a module that registers rules when it is imported (``sinklab.plugins``); nothing in
sinklab is edited. A rule is a function of the scores (..., q, k) and a boolean mask (True where
a query may see a key) that returns weights of the same shape, exactly 0 on every masked key.
Its keyword-only parameters are its keyword arguments (``model.attention_args.NAME``): each one
is annotated with its type, has a default, and is described by an ``Arg``. ``row_kind`` says
what a row of weights can sum to (``sinklab.attention.ROW_KINDS``). The docstring's first
paragraph is what ``sinklab rules`` shows.
"""

from __future__ import annotations

from torch import Tensor

from sinklab.attention import Arg, register, softmax


@register("softmax_t", row_kind="simplex", kwargs={
    "t": Arg("the temperature: every score is divided by it before the softmax", "a number > 0",
             check=lambda t: t > 0)})
def softmax_t(scores: Tensor, mask: Tensor, *, t: float = 1.0) -> Tensor:
    """Softmax at temperature t: softmax(S / t) over the visible keys (the temperature of
    Hinton et al., 2015, "Distilling the knowledge in a neural network").

    t > 1 flattens every row, t < 1 sharpens it; t = 1 is sinklab's softmax.
    """
    return softmax(scores / t, mask)
