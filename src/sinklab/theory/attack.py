"""The worst-case error of a trained model over the task's whole input set, searched by attack.

The task's inputs are every content in [-1, 1]^(d-3) at every non-BOS token (the trigger's
included) and every trigger position j in 2..L-1. A model's error at row i of an input is
||y_i - target_i||_inf (``sinklab.task.targets``). Random test sequences sample this set; here
a projected-gradient attack (PGD) searches it for the inputs with the largest error, per row
type and query position:

    "bos"      row 0 (target 0 or e_0): the same for every input, so computed once, exactly
    "pre"      rows 1 <= i < j: no trigger visible yet
    "trigger"  row i = j
    "post"     rows i > j: the trigger in the past

Causality makes a pre row's output independent of j (every j > i gives row i the same
prefix), so the pre rows are attacked once, with the trigger at the largest position attacked;
trigger and post rows are attacked at every trigger position.

Every value found is the error of a real input (the witness), so it is a LOWER bound on the
supremum error: an attack, not a certificate. Usage::

    cfg, model = sinklab.train.load_model(run_dir)
    worst = attack(model, cfg)
    worst.max("pre"), worst.witness["pre"][worst.argmax("pre")]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from sinklab import kernels
from sinklab.config import RunConfig
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import CONTENT_START, encode, targets

KINDS = ("bos", "pre", "trigger", "post")
STEP_START, STEP_END = 0.5, 0.01  # sign-step sizes of the first and last step (geometric decay)
# What ``sinklab worst`` allows (``sinklab.theory.bounds.worst_runs``): the attack's memory does
# not grow with either, its time grows in proportion to both; 100,000 steps is 1,000 times the
# default, hours for a 1x1 model on a CPU.
MAX_STEPS = 100_000
MAX_RESTARTS = 1_000
BATCH_BYTES = 200e6  # the memory one forward and backward pass may use, roughly
MAX_BATCH = 2048  # sequences per pass: larger batches only run slower on a CPU's caches


@dataclass
class WorstCase:
    """The largest error an attack found, per row type (``KINDS``) and query position 0..L-1.

    ``error[kind][i]`` is the error at row i of the worst input found, NaN where that row type
    cannot occur at i (or its trigger positions were not attacked); ``witness[kind][i]`` is that
    input: ``{"trigger": j, "coordinate": m, "sign": s, "content": (L, d - 3) nested list}``,
    with s (y_im - target_im) = error, or None. An error is a lower bound on the supremum over
    the task's inputs; a non-finite model output counts as an infinite error.
    """

    seq_len: int
    triggers: list[int]  # the trigger positions attacked
    steps: int
    restarts: int
    seed: int
    n_starts: int  # the caller's extra starts, tried for every objective
    error: dict[str, list[float]]
    witness: dict[str, list[dict[str, Any] | None]]

    def _check_kind(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"row type {kind!r} is not known: choose one of {', '.join(KINDS)}.")

    def argmax(self, kind: str) -> int | None:
        """The position with the largest error of row type ``kind``; None if it never occurs."""
        self._check_kind(kind)
        found = [(e, i) for i, e in enumerate(self.error[kind]) if not math.isnan(e)]
        return max(found, key=lambda p: (p[0], -p[1]))[1] if found else None

    def max(self, kind: str) -> float:
        """The largest error of row type ``kind`` over positions (NaN if it never occurs)."""
        i = self.argmax(kind)
        return float("nan") if i is None else self.error[kind][i]

    def to_dict(self, contents: Literal["none", "max", "all"] = "max") -> dict[str, Any]:
        """JSON-able: NaN becomes None. Witness contents are large, so by default only the
        maximiser of each row type keeps its content (``"all"``: every witness, ``"none"``: no
        content at all)."""
        if contents not in ("none", "max", "all"):
            raise ValueError(f"contents={contents!r} is not allowed: choose none, max or all.")
        witness: dict[str, list[dict[str, Any] | None]] = {}
        for kind in KINDS:
            best = self.argmax(kind)
            witness[kind] = [
                None if w is None else
                w if contents == "all" or (contents == "max" and i == best) else
                {k: v for k, v in w.items() if k != "content"}
                for i, w in enumerate(self.witness[kind])]
        return {
            "seq_len": self.seq_len, "triggers": list(self.triggers), "steps": self.steps,
            "restarts": self.restarts, "seed": self.seed, "n_starts": self.n_starts,
            "error": {k: [_json_float(e) for e in self.error[k]] for k in KINDS},
            "max": {k: _json_float(self.max(k)) for k in KINDS},
            "argmax": {k: self.argmax(k) for k in KINDS},
            "witness": witness,
        }


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(model: AttentionStack, cfg: RunConfig, steps: int, restarts: int,
                     seed: int, triggers: Sequence[int] | None, starts: Tensor | None,
                     dtype: torch.dtype) -> list[int]:
    """Refuse bad arguments in one sentence each; return the sorted trigger positions."""
    seq_len, d_model = cfg.task.seq_len, cfg.task.d_model
    if not _is_int(steps) or steps < 0:
        raise ValueError(f"steps={steps!r} is not allowed: it must be an integer >= 0.")
    if not _is_int(restarts) or restarts < 1:
        raise ValueError(f"restarts={restarts!r} is not allowed: it must be an integer >= 1.")
    if not _is_int(seed) or not 0 <= seed < 2**63:
        raise ValueError(f"seed={seed!r} is not allowed: it must be an integer in 0..2^63 - 1.")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype} is not allowed: it must be a floating-point type.")
    if model.n_members != 1:
        raise ValueError(f"the model is an ensemble of {model.n_members} members: attack takes "
                         "a one-member model, as sinklab.train.load_model returns.")
    if model.d_model != d_model:
        raise ValueError(f"the model has d_model={model.d_model} but the config "
                         f"task.d_model={d_model}: give the config the model was trained with.")
    allowed = range(2, seq_len)
    chosen = list(allowed) if triggers is None else list(triggers)
    bad = [j for j in chosen if not _is_int(j) or j not in allowed]
    if bad or not chosen:
        what = f"trigger position {bad[0]!r}" if bad else "an empty list of trigger positions"
        raise ValueError(f"{what} is not allowed: give trigger positions in 2..{seq_len - 1} "
                         f"for seq_len={seq_len}.")
    if starts is not None:
        wanted = f"(n, {seq_len}, {d_model - 3})"
        if not isinstance(starts, Tensor):
            raise ValueError(f"starts of type {type(starts).__name__} are not allowed: give a "
                             f"tensor of contents of shape {wanted}.")
        if starts.dim() != 3 or tuple(starts.shape[1:]) != (seq_len, d_model - 3):
            raise ValueError(f"starts of shape {tuple(starts.shape)} are not allowed: give "
                             f"contents of shape {wanted}.")
        if not (torch.isfinite(starts).all() and starts.abs().le(1).all()):
            raise ValueError("starts are not allowed outside [-1, 1]: every content value of "
                             "the task lies in [-1, 1].")
    return sorted(set(chosen))


def batch_bytes(model: AttentionStack, seq_len: int, dtype: torch.dtype) -> int:
    """An estimate of the bytes one sequence takes in the attack's forward and backward pass:
    per layer, (query, key) and (query, width) tensors for every head and a few (query, width)
    tensors for the stream (more for a standard block's MLP). The constants are about twice
    the peak memory measured on a CPU for 1x1 to 4x4 models at L = d = 16 (3 H L (L + d)
    + 5 L d numbers per layer, 8 L d more for a standard block, 4 L d for the stream)."""
    cfg, d = model.cfg, model.d_model
    per_layer = 6 * cfg.n_heads * seq_len * (seq_len + d) + 10 * seq_len * d
    if cfg.block == "standard":
        per_layer += 16 * seq_len * d
    return dtype.itemsize * (cfg.n_layers * per_layer + 8 * seq_len * d)


@torch.no_grad()
def attack(model: AttentionStack, cfg: RunConfig, *, steps: int = 100, restarts: int = 2,
           seed: int = 0, triggers: Sequence[int] | None = None, starts: Tensor | None = None,
           dtype: torch.dtype = torch.float64, per_coordinate: bool = True) -> WorstCase:
    """Search the task's input set for the largest error of a one-member ``model``, per row
    type and position, by projected sign-gradient ascent: a LOWER bound on the supremum error
    (an attack, not a certificate).

    One objective per (trigger position j, row i, output coordinate m, sign s): maximise
    s (y_im - target_im) over the contents (L, d - 3) of the non-BOS tokens; the supremum of
    the L-inf error of row i is the largest of these. Each objective runs from ``restarts``
    random starts (uniform in the box and random box vertices, alternately) and from every row
    of ``starts`` (n, L, d - 3) if given; each step moves every content value by +-eta (eta
    from ``STEP_START`` down to ``STEP_END``, geometrically) along the sign of the gradient,
    then clamps it to [-1, 1]. Every point visited is evaluated (the start and the final point
    included) and row i's L-inf error there is what counts, so the best value seen is kept,
    not the last. Each (type, position)'s best input is finally evaluated again as a whole
    sequence of length L: that value is the one reported, so it is the error of its witness.

    The objectives run as batches of sequences, ordered by row and chunked so that a pass
    stays under ``BATCH_BYTES``. Row i depends on tokens 0..i only, so when the model's rows
    are also independent of the sequence's length (checked numerically, ``_length_free``;
    not so for ReLU / L) a chunk is searched on its sequences' first max(i) + 2 tokens (one
    to spare for a trigger after every row of the chunk). The starts are drawn at full length
    either way, so on a CPU the result does not depend on the chunking, to rounding.

    ``per_coordinate=False`` is the 2d-times cheaper search: one objective per (j, i), the row's
    L-inf error itself, whose gradient follows whichever coordinate is largest at each step;
    the restarts then stand in for the coordinates and signs.

    ``triggers`` restricts the trigger positions (default 2..L-1): pre rows are attacked below
    the largest one (their witnesses put the trigger there), so the cheap mode
    ``triggers=[L-1]`` covers every pre row and the last trigger row. The attack runs on the
    model's device in ``dtype``, on a cast copy (the caller's model is left alone); the random
    starts come from a generator seeded with ``seed`` on that device.
    """
    chosen = _check_arguments(model, cfg, steps, restarts, seed, triggers, starts, dtype)
    # The fused CPU kernel (float32 only) is compiled once per sequence length, and the search
    # runs many lengths: PyTorch's operators serve them all.
    with kernels.disabled():
        return _attack(model, cfg, steps, restarts, seed, chosen, starts, dtype,
                       per_coordinate)


def _attack(model: AttentionStack, cfg: RunConfig, steps: int, restarts: int, seed: int,
            chosen: list[int], starts: Tensor | None, dtype: torch.dtype,
            per_coordinate: bool = True) -> WorstCase:
    """``attack`` on checked arguments, ``chosen`` the sorted trigger positions."""
    device = next(model.parameters()).device
    net = copy.deepcopy(model).to(dtype).requires_grad_(False)
    seq_len, d_model = cfg.task.seq_len, cfg.task.d_model
    extra = None if starts is None or len(starts) == 0 else starts.to(device, dtype)
    n_starts = 0 if extra is None else len(extra)
    generator = torch.Generator(device=device).manual_seed(seed)
    found = _Records(net, seq_len, cfg.residual)

    # BOS row: x_0 = e_0 in every input, and nothing else is visible to it.
    last = chosen[-1]
    zero = torch.zeros(1, seq_len, d_model - 3, dtype=dtype, device=device)
    found.offer(torch.tensor([last], device=device), torch.tensor([0], device=device), zero)

    # The (i, j) pairs, by row: under the largest trigger every row from 1 up, under the others
    # every row from j up.
    pairs = torch.tensor(sorted((i, j) for j in chosen
                                for i in range(1 if j == last else j, seq_len)), device=device)
    per_pair = (d_model * 2 if per_coordinate else 1) * (restarts + n_starts)
    n_runs = len(pairs) * per_pair
    chunk = max(1, min(MAX_BATCH, int(BATCH_BYTES // batch_bytes(net, seq_len, dtype))))
    truncate = _length_free(net, cfg)
    etas = step_sizes(steps)
    for first in range(0, n_runs, chunk):
        runs = torch.arange(first, min(first + chunk, n_runs), device=device)
        if per_coordinate:
            i, j, m, s = _objectives(runs, pairs, d_model, restarts + n_starts)
        else:  # one objective per pair, the row's L-inf error (m and s unused)
            i, j = pairs[runs // (restarts + n_starts)].unbind(-1)
            m, s = torch.zeros_like(i), torch.ones_like(i)
        # Runs are sorted by row. A truncated chunk keeps one token after its last row, so
        # that a trigger beyond it can sit there, after every row it is searched on.
        length = min(int(i[-1].item()) + 2, seq_len) if truncate else seq_len
        start = runs % (restarts + n_starts)
        content = _starts(start, restarts, extra, (seq_len, d_model - 3), generator,
                          dtype)[:, :length]
        value, best = _ascend(net, j.clamp(max=length - 1), i, m, s, content, etas,
                              cfg.residual, per_coordinate)
        # the best run of each (row type, position) in the chunk, as a whole sequence
        key = torch.where(i < j, 0, torch.where(i == j, 1, 2)) * seq_len + i
        keys = key.unique()
        winners = torch.where(key == keys[:, None], value, -math.inf).argmax(dim=1)
        whole = torch.zeros(len(winners), seq_len, d_model - 3, dtype=dtype, device=device)
        whole[:, :length] = best[winners]
        found.offer(j[winners], i[winners], whole)
    return WorstCase(seq_len=seq_len, triggers=chosen, steps=steps, restarts=restarts,
                     seed=seed, n_starts=n_starts, error=found.error, witness=found.witness)


def check_budget(flag: str, value: Any, most: int) -> None:
    """ConfigError, in one sentence naming ``flag`` as the user gave it, unless ``value`` is an
    integer from 1 to ``most`` (``MAX_STEPS``, ``MAX_RESTARTS``): the attack's time grows in
    proportion to its steps and restarts, its memory does not."""
    if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most):
        raise ConfigError(f"{flag}={value!r} is not allowed: it must be an integer from 1 to "
                          f"{most:,}, since the attack's time grows in proportion to it.")


@dataclass(frozen=True)
class StepSizes(Sequence[float]):
    """The sign-step sizes, ``STEP_START`` to ``STEP_END`` geometrically over ``steps``, each
    computed when asked for: a list of them would hold every step's size, so that the memory
    grew with the steps (32 GB for a billion)."""

    steps: int

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, t: int) -> float:  # type: ignore[override]
        if not 0 <= t < self.steps:
            raise IndexError(f"step {t} is not one of 0..{self.steps - 1}")
        if self.steps == 1:
            return STEP_START
        return STEP_START * (STEP_END / STEP_START) ** (t / (self.steps - 1))


def step_sizes(steps: int) -> StepSizes:
    """The sign-step sizes of ``steps`` steps (``StepSizes``)."""
    return StepSizes(steps)


def _objectives(runs: Tensor, pairs: Tensor, d_model: int, n_starts: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The row i, trigger j, coordinate m and sign s (each (B,)) of the runs with flat indices
    ``runs`` (B,), ordered by (i, j) pair, then m, then s, then start."""
    rest = runs // n_starts
    s = 1 - 2 * (rest % 2)
    rest = rest // 2
    i, j = pairs[rest // d_model].unbind(-1)
    return i, j, rest % d_model, s


def _starts(start: Tensor, restarts: int, extra: Tensor | None, shape: tuple[int, int],
            generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """Start contents (B, L, d - 3) for the start indices (B,): uniform in the box for even
    restarts, a random box vertex for odd ones, ``extra[k]`` for start restarts + k."""
    u = torch.rand(len(start), *shape, generator=generator, device=start.device,
                   dtype=dtype) * 2 - 1
    vertex = torch.where(u < 0, -1.0, 1.0).to(dtype)
    content = torch.where((start % 2 == 1)[:, None, None], vertex, u)
    if extra is not None:
        given = start >= restarts
        content[given] = extra[start[given] - restarts]
    content[:, 0] = 0.0  # BOS carries no content
    return content


def _length_free(net: AttentionStack, cfg: RunConfig) -> bool:
    """Whether the model's first T output rows on the first T tokens of a sequence equal its
    first T rows on the whole sequence, for every T, on a few random task sequences (to
    rounding: a rule that divides by the length, as ReLU / L does, fails by a factor). The
    sequences come from a generator of their own, so the search's starts do not depend on
    this check."""
    seq_len, d_model = cfg.task.seq_len, cfg.task.d_model
    dtype, device = net.blocks[0].attn.w_q.dtype, net.blocks[0].attn.w_q.device
    generator = torch.Generator(device=device).manual_seed(0)
    n = 2 * (seq_len - 2)  # every trigger position, twice
    trigger = torch.arange(n, device=device) % (seq_len - 2) + 2
    content = torch.rand(n, seq_len, d_model - 3, generator=generator, device=device,
                         dtype=dtype) * 2 - 1
    x = encode(content, trigger)
    whole = net(x).out[0]
    tol = 1e3 * torch.finfo(dtype).eps * (1 + whole.abs().max())
    return all(bool((net(x[:, :t]).out[0] - whole[:, :t]).abs().max() <= tol)
               for t in range(1, seq_len))


def _row_errors(net: AttentionStack, x: Tensor, j: Tensor, i: Tensor, residual: bool) -> Tensor:
    """y_i - target_i (B, d) at row i (B,) of the inputs x (B, T, d) with triggers at j (B,)."""
    rows = torch.arange(len(i), device=i.device)
    return net(x).out[0][rows, i] - targets(x, j, residual)[rows, i]


def _linf(e: Tensor) -> Tensor:
    """The L-inf norm over the last axis, a non-finite entry counting as infinite."""
    return e.abs().nan_to_num(nan=math.inf).amax(dim=-1)


def _ascend(net: AttentionStack, j: Tensor, i: Tensor, m: Tensor, s: Tensor, content: Tensor,
            etas: Sequence[float], residual: bool, per_coordinate: bool = True
            ) -> tuple[Tensor, Tensor]:
    """Projected sign-gradient ascent on s (y_im - target_im), or with ``per_coordinate``
    false on row i's L-inf error, one run per sequence of contents (B, T, d - 3) with the
    trigger at j (B,); returns the largest row-i L-inf error seen by each run (B,) and the
    contents that gave it.

    The ascent moves the inputs x themselves, with the gradient kept to the content entries
    (non-BOS rows, coordinates 2..d-2): clamping all of x to [-1, 1] then projects the content
    and leaves the 0/1 flags as they are.
    """
    rows = torch.arange(len(j), device=j.device)
    x = encode(content, j)
    free = torch.zeros_like(x[0])  # (T, d): 1 at the content entries, 0 elsewhere
    free[1:, CONTENT_START:-1] = 1.0
    best_value = torch.full((len(j),), -math.inf, dtype=x.dtype, device=x.device)
    best = x.clone()
    for t in range(len(etas) + 1):
        x.requires_grad_(t < len(etas))
        with torch.enable_grad():
            e = _row_errors(net, x, j, i, residual)
            if not per_coordinate:  # the row's L-inf error
                objective = e.abs().amax(dim=-1).sum()
            else:  # one per sequence: one backward serves all
                objective = (s * e[rows, m]).sum()
        value = _linf(e.detach())
        better = value > best_value
        torch.where(better, value, best_value, out=best_value)
        torch.where(better[:, None, None], x.detach(), best, out=best)
        if t == len(etas):
            break
        (grad,) = torch.autograd.grad(objective, x)
        step = grad.sign_().nan_to_num_(nan=0.0).mul_(free * etas[t])
        x = x.detach().add_(step).clamp_(-1.0, 1.0)
    return best_value, best[..., CONTENT_START:-1]


class _Records:
    """The worst input found so far per (row type, position), as ``WorstCase`` holds them."""

    def __init__(self, net: AttentionStack, seq_len: int, residual: bool) -> None:
        self.net, self.residual = net, residual
        self.error = {k: [float("nan")] * seq_len for k in KINDS}
        self.witness: dict[str, list[dict[str, Any] | None]] = {k: [None] * seq_len
                                                                for k in KINDS}

    def offer(self, j: Tensor, i: Tensor, content: Tensor) -> None:
        """Evaluate row i (B,) of the whole inputs with contents (B, L, d - 3) and triggers j
        (B,), and keep each one that beats the record of its row type and position."""
        e = _row_errors(self.net, encode(content, j), j, i, self.residual)
        for jw, iw, row, c in zip(j.tolist(), i.tolist(), e, content):
            kind = "bos" if iw == 0 else "pre" if iw < jw else "trigger" if iw == jw else "post"
            value = _linf(row).item()
            if not math.isnan(self.error[kind][iw]) and value <= self.error[kind][iw]:
                continue
            m = int(row.abs().nan_to_num(nan=math.inf).argmax().item())
            self.error[kind][iw] = value
            self.witness[kind][iw] = {"trigger": jw, "coordinate": m,
                                      "sign": 1 if row[m].item() >= 0 else -1,
                                      "content": c.tolist()}
