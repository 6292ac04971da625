"""The necessity bound's quantities for a single-layer, single-head softmax model (docs/theory.md):
BOS's value, the widest value an ordinary token can add, and the errors at the inputs of the
bound's two parts and of its proof, all exact (``necessity``).

    from sinklab.theory.necessity import necessity
    necessity(model, cfg)["w_star"]  # the widest value, against 1 - error - nu

The weights are folded as for the certificate (``sinklab.theory.rows.folded``), so a model
outside the paper's class is refused in the same sentence (NotCertifiable).
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch
from torch import Tensor

from sinklab.config import RunConfig
from sinklab.model import AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER, targets
from sinklab.theory.rows import Folded, NotCertifiable, folded


def necessity(model: AttentionStack, cfg: RunConfig) -> dict[str, Any]:
    """The quantities of the necessity bound (docs/theory.md) for a single-layer, single-head
    softmax model, all exact:

    - ``nu`` = ||v_0||_inf, BOS's value v_0 = e_0 M, which is also the output at row 0;
    - ``w_star`` = max over contents c of ||w(c)||_inf, w(c) = (e_{d-1} + c - e_0) M, in closed
      form max_m (|M[d-1, m] - M[0, m]| + sum_r |M[r, m]| over content rows r), attained at the
      content ``c_star`` (a vertex) and coordinate ``m_star``;
    - ``delta`` = (L - 2) / (L - 1), the share of the trigger row's mean the content carries when
      the trigger at L - 1 has content 0;
    - per pre row i = 1..L-2, at the input X* whose every content is c_star (trigger at L - 1):
      the BOS mass ``bos`` b_i(X*), the error ``error`` ||y_i(X*)||_inf, and the bound's value
      ``bound`` (1 - b_i(X*)) w_star - nu (part 1: the supremum error at row i is at least this);
    - ``proof_errors``: per content coordinate m, the largest trigger-row error at coordinate m
      over the two inputs of part 2's proof (ordinary contents +-1 at m, 0 elsewhere, trigger
      content 0), so that w_star >= delta - proof_error - nu can be checked for every m;
    - ``proof_errors_full``: the same at the inputs where the trigger carries the ordinary
      tokens' content too (every non-BOS token +-e_m), whose trigger-row target at m is the full
      +-1: the sharper lemma w_star >= 1 - proof_error_full - nu (proof: the trigger's value
      differs from an ordinary token's of the same content by the constant kappa = (e_1 -
      e_{d-1}) M; if kappa_m >= 0, at the input with content -e_m the trigger row's output at m,
      a convex combination of v_0m, O_m and O_m + kappa_m, is at least that of v_0m and O_m, so
      reaching -1 + eps there needs O_m - v_0m <= -(1 - eps - nu); if kappa_m < 0, the same at
      +e_m). The constant 1 cannot be raised: the sink family has w_star = 1 and errors -> 0.
    """
    f = folded(model, cfg)
    if f.rule != "softmax":
        raise NotCertifiable(f"the necessity bound is about softmax; this model's rule is "
                             f"{f.rule!r}.")
    d, L = f.d, f.seq_len
    nu = f.m[BOS].abs().max().item()
    w_star, m_star, c_star = widest_value(f.m)
    n = d - 3
    proof = torch.zeros(2 * n, n, dtype=f.m.dtype, device=f.m.device)  # +-e_r, row by row
    proof[torch.arange(2 * n), torch.arange(n).repeat_interleave(2)] = \
        torch.tensor([1.0, -1.0], dtype=f.m.dtype, device=f.m.device).repeat(n)
    inputs = torch.stack([uniform_input(f, c_star, trigger_content=c_star)]
                         + [uniform_input(f, c, trigger_content=torch.zeros_like(c))
                            for c in proof]
                         + [uniform_input(f, c, trigger_content=c) for c in proof])
    # one pass: X*, then both lemmas' proof inputs
    weights, err = forward_errors(model, cfg, inputs)
    row_err = err.abs().amax(-1)
    out_rows = []
    for i in range(1, L - 1):
        b = weights[0, i].item()
        out_rows.append({"i": i, "bos": b, "error": row_err[0, i].item(),
                         "bound": (1 - b) * w_star - nu})
    coords = torch.arange(n, device=err.device).repeat_interleave(2)

    def at_own_coordinate(e: Tensor) -> list[float]:  # (2n, L, d) -> per m, the larger of +-
        at_coord = e[:, L - 1, CONTENT_START:d - 1].abs()  # (2n, n): proof input, coordinate
        return at_coord[torch.arange(2 * n), coords].view(n, 2).amax(-1).tolist()

    return {"nu": nu, "w_star": w_star, "m_star": m_star, "c_star": c_star.tolist(),
            "delta": (L - 2) / (L - 1), "rows": out_rows,
            "proof_errors": at_own_coordinate(err[1:1 + 2 * n]),
            "proof_errors_full": at_own_coordinate(err[1 + 2 * n:]), "seq_len": L}


def widest_value(m: Tensor, relative_to_bos: bool = True) -> tuple[float, int, Tensor]:
    """max over contents c of ||w(c)||_inf for the value map M = ``m`` (d, d), with w(c) the
    value of the ordinary token with content c, x(c) M, minus BOS's (``relative_to_bos``) or
    not: the closed form max_m (|lift_m| + sum_r |M[r, m]|) over content rows r, lift =
    M[d-1] - M[0] (or M[d-1]). Returned: the maximum, its coordinate and the vertex c attaining
    it."""
    d = m.shape[-1]
    cs = slice(CONTENT_START, d - 1)
    lift = m[d - 1] - m[BOS] if relative_to_bos else m[d - 1]
    per = lift.abs() + m[cs].abs().sum(0)
    col = int(per.argmax())
    sign = 1.0 if lift[col] >= 0 else -1.0
    vertex = sign * torch.where(m[cs][:, col] >= 0, 1.0, -1.0).to(m)
    return per[col].item(), col, vertex


def uniform_input(f: Folded, content: Tensor, trigger_content: Tensor) -> Tensor:
    """The sequence (L, d) whose ordinary tokens all carry ``content``, with the trigger at
    L - 1 carrying ``trigger_content``: every row before L - 1 is a pre row."""
    L = f.seq_len
    x = f.token(f.d - 1, content.expand(L, -1).clone())
    x[0] = 0.0
    x[0, BOS] = 1.0
    x[L - 1] = f.token(TRIGGER, trigger_content)
    return x


@torch.no_grad()
def forward_errors(model: AttentionStack, cfg: RunConfig, x: Tensor) -> tuple[Tensor, Tensor]:
    """Layer 1's BOS weights (B, L) at every row and the signed errors (B, L, d) of inputs x
    (B, L, d) with the trigger at L - 1, in float64 on the model's device (on a cast copy)."""


    weight = next(model.parameters())
    m64 = deepcopy(model).to(torch.float64)
    x = x.to(device=weight.device, dtype=torch.float64)
    trig = torch.full((x.shape[0],), x.shape[1] - 1, device=x.device)
    out = m64(x, return_weights=True)
    return out.patterns[0][0, :, 0, :, 0], out.out[0] - targets(x, trig, cfg.residual)
