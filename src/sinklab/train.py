"""Training: the paper's protocol for an ensemble of independent models run as one program.

``train_runs(configs, run_dirs)`` trains one model per config. The configs may differ only in
``train.seed`` and ``train.lr``; everything else is shared, so the members are stacked on a leading
axis and one forward, backward and optimiser step serves them all. Each member:

- starts from weights drawn with its own seed, and sees its own data stream, exactly the ones it
  would get if trained alone;
- is checked against the stop rule on every step: at step s (after s updates) a fresh batch is
  drawn and, if its L-infinity error is below ``train.tol``, the member stops with ``steps = s``
  and gets no further update of its weights or Adam moments;
- stops as "diverged" when its loss is NaN or inf, as "plateau" by the plateau rule
  (``train.patience``, stated by ``plateau_rule_text``), and as "max_steps" after
  ``train.max_steps``.

A member is finished, evaluated and written (``RunWriter``) as soon as it stops, so an
interrupted ensemble keeps every member that had already finished. With ``train.save_every`` its
weights are also saved along the way, as ``checkpoints/step{s:06d}.pt`` (``list_checkpoints``,
``load_checkpoint``).
"""

from __future__ import annotations

import ctypes
import functools
import io
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from sinklab import __version__, kernels, metrics
from sinklab.config import (
    DEFAULT_DROP_FACTOR,
    RunConfig,
    build_run_config,
    check_device,
    derive_seed,
    setting,
)
from sinklab.errors import ConfigError, ResultsError
from sinklab.evaluate import eval_batch, evaluate
from sinklab.model import AttentionStack
from sinklab.runs import folders, limits
from sinklab.runs.files import MetricsLog, read_json, write_atomic, write_json, write_npz
from sinklab.task import TrainStream

CONVERGED, MAX_STEPS, DIVERGED, PLATEAU = 1, 2, 3, 4
STATUS = {CONVERGED: "converged", MAX_STEPS: "max_steps", DIVERGED: "diverged",
          PLATEAU: "plateau"}

CHECKPOINTS = "checkpoints"  # the folder of a run's saved weights (train.save_every)
CHECKPOINT = re.compile(r"step([0-9]+)\.pt")


def plateau_rule_text(patience: int, lr_drops: int = 0,
                      lr_drop_factor: float = DEFAULT_DROP_FACTOR) -> str:
    """The plateau rule (``train.patience``) in words, for reports to quote.

    A member's best is the lowest training-batch L-infinity error it has had so far; a step sets
    a new best only when its error is strictly below that. A member whose last new best was at
    step b stops at step s = b + patience, the first step at which it has gone ``patience``
    consecutive steps without one. Reaching ``train.tol`` and diverging take precedence at the
    same step; ``train.max_steps`` still caps the run (a run that plateaus exactly at the cap is
    reported as a plateau). With ``train.lr_drops`` = k, the rule's first k firings for a run do
    not stop it: its learning rate is multiplied by ``train.lr_drop_factor`` from that step's
    update on and its count of steps without a new best starts again at that step (its best is
    kept); the (k+1)-th stops it. Implemented on the device by ``Plateau``.
    """
    if patience == 0:
        return "no plateau rule (train.patience=0): a run stops only at train.tol, on " \
               "divergence or at train.max_steps"
    text = (f"a run stops on a plateau when its training-batch L∞ error has not set a new best "
            f"(strictly below every earlier step's) for {patience:,} consecutive steps; "
            "reaching train.tol or diverging at the same step takes precedence, and "
            "train.max_steps still caps the run")
    if lr_drops:
        text += (f"; the first {lr_drops} time(s) the rule fires the run does not stop: its "
                 f"learning rate is multiplied by {lr_drop_factor:g} from that step on and the "
                 f"count of {patience:,} steps starts again there, its best error kept")
    return text


class Plateau:
    """The plateau rule (``plateau_rule_text``) for every member at once, on the device.

    Holds each member's best training L-infinity error so far and the step that set it, so
    ``update`` adds a few elementwise operations per step and no read by the host.
    """

    def __init__(self, patience: int, n_members: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.patience = patience
        self.best = torch.full((n_members,), math.inf, device=device, dtype=dtype)
        self.best_step = torch.zeros(n_members, dtype=torch.long, device=device)

    def restart(self, members: Tensor, step: int) -> None:
        """Start the count of ``members`` (a boolean mask) again at ``step``, their best kept."""
        self.best_step = torch.where(members, step, self.best_step)

    def update(self, step: int, linf: Tensor) -> Tensor:
        """Record step ``step``'s errors ``linf`` (members,); True where a member has now gone
        ``patience`` consecutive steps without a new best."""
        improved = linf < self.best  # NaN never improves (and diverges anyway)
        self.best = torch.where(improved, linf, self.best)
        self.best_step = torch.where(improved, step, self.best_step)
        return step - self.best_step >= self.patience


def stop_codes(linf: Tensor, loss: Tensor, tol: float, stalled: Tensor | None) -> Tensor:
    """Each member's status code (``STATUS``) were it to stop now, from its training-batch
    L-infinity error and loss (members,) and the plateau rule's verdict (None: no rule).

    Precedence: converged (``linf < tol``), then diverged (the loss is NaN or inf), then plateau,
    then max_steps. A converging step always sets a new best (every earlier step was >= tol), so
    converged and plateau never meet; diverged and plateau can.
    """
    ending = MAX_STEPS if stalled is None else torch.where(stalled, PLATEAU, MAX_STEPS)
    return torch.where(linf < tol, CONVERGED,
                       torch.where(torch.isfinite(loss), ending, DIVERGED))


def resolve_device(name: str, flag: str = "train.device") -> torch.device:
    """``auto`` is CUDA when available, else the CPU; asking for absent CUDA (or a GPU index
    this machine does not have) is a ConfigError naming ``flag``."""
    check_device(name, flag)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ConfigError(f"{setting(flag, name)} is not available on this machine: use cpu "
                              "or auto.")
    return torch.device(name)


# Attention weights per training step (members x batch x layers x heads x L^2) below which one
# thread beats two on a CPU: the hand-off costs more than the second core gains
# (benchmarks/fast_paths.py, section 3).
SMALL_STEP = 2**17


def step_threads(cfg: RunConfig, n_members: int, device: torch.device) -> int:
    """The torch threads to train with: one for a tiny CPU step, else the current setting."""
    size = (n_members * cfg.train.batch_size * cfg.model.n_layers * cfg.model.n_heads
            * cfg.task.seq_len**2)
    return 1 if device.type == "cpu" and size < SMALL_STEP else torch.get_num_threads()


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's allocator to keep freed memory for reuse instead of handing it back.

    A training step frees and reallocates the same few megabytes of activations; by default
    glibc maps blocks above 128 KiB afresh and trims the heap as soon as its free top exceeds
    twice that, so every step pays page faults on memory it just released. Keeping up to
    256 MiB of freed heap (and serving blocks up to 32 MiB from it) removes them. A no-op
    (False) where the C library is not glibc. Called once per process, at the first training.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_TRIM_THRESHOLD, 256 << 20)) and bool(mallopt(M_MMAP_THRESHOLD,
                                                                      32 << 20))


def versions() -> dict[str, str]:
    """Package versions recorded beside every result."""
    return {"sinklab": __version__, "torch": torch.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0]}


class MemberAdam:
    """Adam (Kingma & Ba, 2015) over parameters with a leading member axis.

    Each member has its own learning rate. ``freeze(members)`` stops members for good: from then
    on their weights *and* moments stay exactly as they are, so a stopped member ends where it
    would have ended alone. Members that are still training have all had the same number of
    updates, so the bias corrections are shared scalars. Unfrozen, it computes the same update as
    ``torch.optim.Adam`` (no weight decay, no amsgrad) with the same operations.

    For speed the parameters are moved into one flat buffer (each parameter a contiguous chunk of
    it, so the modules keep their own ``nn.Parameter`` objects) and their gradients into another,
    so a step is a handful of tensor operations whatever the number of parameters.
    """

    def __init__(self, params: Sequence[Tensor], lr: Tensor, betas: tuple[float, float],
                 eps: float) -> None:
        self.params = list(params)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.t = 0  # updates so far of every member still training
        total = sum(p.numel() for p in self.params)
        ref = self.params[0]
        self.flat = torch.empty(total, dtype=ref.dtype, device=ref.device)
        self.grad = torch.zeros_like(self.flat)
        self._grads: list[Tensor] = []
        members = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                chunk = self.flat[offset:offset + n].view_as(p)
                chunk.copy_(p)
                p.data = chunk  # the parameter now lives in the flat buffer
                self._grads.append(self.grad[offset:offset + n].view_as(p))
                p.grad = self._grads[-1]
                members.append(torch.arange(p.shape[0], device=p.device)
                               .repeat_interleave(n // p.shape[0]))
                offset += n
        self.member = torch.cat(members)  # (total,): which member each element belongs to
        # Learning rates stay in float64 so that lr / (1 - beta1^t) rounds as torch.optim.Adam's
        # Python scalar does; one rate for all is kept as a Python float.
        lr = lr.to(device=self.flat.device, dtype=torch.float64)
        self.lr: float | Tensor = lr[0].item() if bool((lr == lr[0]).all()) else lr
        self.frozen = torch.zeros(len(lr), dtype=torch.bool, device=self.flat.device)
        self._on: Tensor | None = None  # per-element "still training", once any member froze
        self.m = torch.zeros_like(self.flat)
        self.v = torch.zeros_like(self.flat)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def scale_lr(self, members: Tensor, factor: float) -> None:
        """Multiply the learning rates of ``members`` (a boolean mask over members) by ``factor``,
        in float64 as a Python float would be; one rate for all stays a Python float."""
        lr = self.lr if isinstance(self.lr, Tensor) else \
            torch.full((len(self.frozen),), self.lr, dtype=torch.float64, device=self.flat.device)
        lr = torch.where(members.to(lr.device), lr * factor, lr)
        self.lr = lr[0].item() if bool((lr == lr[0]).all()) else lr

    def lrs(self) -> list[float]:
        """Every member's learning rate now."""
        if isinstance(self.lr, float):
            return [self.lr] * len(self.frozen)
        return self.lr.tolist()

    def freeze(self, members: Sequence[int]) -> None:
        """Give these members no further updates (their weights and moments stay as they are)."""
        self.frozen[list(members)] = True
        self._on = ~self.frozen[self.member]

    @torch.no_grad()
    def step(self) -> None:
        for p, g in zip(self.params, self._grads):
            if p.grad is not g:  # a caller replaced .grad instead of accumulating into it
                g.copy_(p.grad)
                p.grad = g
        self.t += 1
        bc1 = 1 - self.beta1 ** self.t
        bc2_sqrt = math.sqrt(1 - self.beta2 ** self.t)
        g, m, v, on = self.grad, self.m, self.v, self._on
        if isinstance(self.lr, float):
            step_size: float | Tensor = -self.lr / bc1
        else:  # per element; the same float32 values the scalar path would use
            step_size = (-self.lr / bc1).to(self.flat.dtype)[self.member]
        if on is None:  # every member trains: torch.optim.Adam's own operations, in place
            m.lerp_(g, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (v.sqrt() / bc2_sqrt).add_(self.eps)
            if isinstance(step_size, float):
                self.flat.addcdiv_(m, denom, value=step_size)
            else:  # addcdiv_'s arithmetic, in its order, with a tensor for the scalar
                self.flat.add_(step_size * m / denom)
            return
        new_m = torch.lerp(m, g, 1 - self.beta1)
        new_v = (v * self.beta2).addcmul_(g, g, value=1 - self.beta2)
        denom = (new_v.sqrt() / bc2_sqrt).add_(self.eps)
        self.flat.add_(torch.where(on, step_size * new_m / denom, 0.0))
        m.copy_(torch.where(on, new_m, m))
        v.copy_(torch.where(on, new_v, v))


def ensemble_part(cfg: RunConfig) -> dict[str, Any]:
    """The part of a config that ensemble members must share (all but seed and lr)."""
    d = cfg.to_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in ("seed", "lr")}
    return d


def check_compatible(cfgs: Sequence[RunConfig]) -> None:
    """Raise ConfigError unless the configs differ only in ``train.seed`` and ``train.lr``."""
    if not cfgs:
        raise ConfigError("an ensemble needs at least one run config.")
    first = ensemble_part(cfgs[0])
    for cfg in cfgs[1:]:
        if ensemble_part(cfg) != first:
            raise ConfigError("ensemble members may differ only in train.seed and train.lr.")


def build_ensemble(cfgs: Sequence[RunConfig], device: torch.device) -> AttentionStack:
    """One AttentionStack with a member per config, each initialised from its own seed."""
    cfg = cfgs[0]
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual,
                           n_members=len(cfgs))
    for e, c in enumerate(cfgs):
        model.init_member(e, torch.Generator().manual_seed(derive_seed(c.train.seed, "init")))
    return model.to(device)


def _select(model: AttentionStack, members: list[int]) -> AttentionStack:
    """A copy of ``model`` holding only the given members (for evaluation)."""
    sub = AttentionStack(model.cfg, model.d_model, residual=model.residual,
                         n_members=len(members))
    index = torch.tensor(members, device=next(model.parameters()).device)
    with torch.no_grad():
        for p_sub, p in zip(sub.parameters(), model.parameters()):
            p_sub.data = p.index_select(0, index).clone()
    return sub


def save_member(model: AttentionStack, member: int, path: Path) -> None:
    """Save one member's weights (without the member axis) to ``path`` atomically.

    The archive is built in memory: saved to a file name, torch would store that (temporary)
    name inside it, and two identical runs would leave different bytes.
    """
    state = {name: p[member].detach().cpu().clone() for name, p in model.named_parameters()}
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path, buf.getvalue())


def checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where a run saves its weights after ``step`` updates: ``checkpoints/step{step:06d}.pt``."""
    return Path(run_dir) / CHECKPOINTS / f"step{step:06d}.pt"


def list_checkpoints(run_dir: Path) -> list[int]:
    """The steps at which ``run_dir`` holds saved weights, in order (empty when it has none)."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = (CHECKPOINT.fullmatch(p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m is not None)


def _clear_checkpoints(run_dir: Path) -> None:
    """Remove the checkpoints of an earlier, unfinished attempt at the run in ``run_dir``: a run
    that starts afresh must not leave another attempt's weights beside its own."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if CHECKPOINT.fullmatch(p.name) or p.name.endswith(".tmp"):
            p.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


class RunWriter:
    """Writes one run's folder while its member trains, so that the folder always shows how far
    the run got (``sinklab.runs.folders``, ``sinklab.runs.files``).

    ``start`` marks the folder (``sinklab.json``), removes an earlier attempt's checkpoints and
    writes ``config.json``; ``log`` appends a ``metrics.jsonl`` row, flushed; ``checkpoint``
    saves the member's weights at a step (``checkpoint_path``); ``finish`` writes
    ``attention.npz``, ``model.pt``, the stop step's checkpoint (with ``train.save_every``),
    ``summary.json``, and the completion record, last. A folder whose writer never finished (the
    training was interrupted, killed or failed) keeps its marker, config, log and checkpoints
    but has no completion record, so it is never taken for a finished run.

        writer = RunWriter.start(run_dir, cfg)
        writer.log({"step": 0, "loss": 0.5, ...})
        writer.finish(model, 0, step, summary, mean=mean, std=std)
    """

    def __init__(self, run_dir: Path, cfg: RunConfig, metrics_log: MetricsLog) -> None:
        self.run_dir, self.cfg, self._log = run_dir, cfg, metrics_log

    @classmethod
    def start(cls, run_dir: Path, cfg: RunConfig) -> RunWriter:
        """Mark ``run_dir`` as a run folder and write its config; return its writer."""
        run_dir = Path(run_dir)
        folders.mark(run_dir, "run")
        _clear_checkpoints(run_dir)
        write_json(run_dir / "config.json", cfg.to_dict())
        return cls(run_dir, cfg, MetricsLog(run_dir / "metrics.jsonl"))

    def log(self, row: dict[str, Any]) -> None:
        """Append one step's row to ``metrics.jsonl``."""
        self._log.write(row)

    def checkpoint(self, model: AttentionStack, member: int, step: int) -> None:
        """Save ``model``'s member ``member`` as the weights after ``step`` updates."""
        save_member(model, member, checkpoint_path(self.run_dir, step))

    def finish(self, model: AttentionStack, member: int, step: int, summary: dict[str, Any],
               mean: np.ndarray, std: np.ndarray) -> None:
        """Write the results of a run that stopped at ``step``: member ``member`` of ``model``
        holds its final weights, ``mean`` and ``std`` (layers, heads, L, L) are its attention
        maps; then seal the folder (``sinklab.runs.folders.seal``)."""
        write_npz(self.run_dir / "attention.npz", mean=mean, std=std)
        save_member(model, member, self.run_dir / "model.pt")
        save_every = self.cfg.train.save_every
        if save_every and step % save_every:  # a multiple was saved with the others this step
            self.checkpoint(model, member, step)
        write_json(self.run_dir / "summary.json", summary)
        self.close()
        folders.seal(self.run_dir)  # last: the run is finished once this is written

    def close(self) -> None:
        """Close ``metrics.jsonl`` (again is harmless)."""
        self._log.close()


def load_model(run_dir: Path, device: str = "cpu") -> tuple[RunConfig, AttentionStack]:
    """The config and trained model (an ensemble of one) of a finished run folder, whose files
    are first checked against its completion record."""
    run_dir = Path(run_dir)
    return _load_weights(run_dir, run_dir / "model.pt", device,
                         f"the run in {run_dir} has not finished")


def load_checkpoint(run_dir: Path, step: int, device: str = "cpu"
                    ) -> tuple[RunConfig, AttentionStack]:
    """The config and the weights saved at ``step`` (an ensemble of one) of a finished run
    folder that was trained with ``train.save_every`` (``list_checkpoints`` gives the steps)."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step={step!r} is not a checkpoint step: it must be an integer >= 0.")
    run_dir = Path(run_dir)
    steps = list_checkpoints(run_dir)
    if not steps:
        where = "none (it was trained with train.save_every=0)"
    elif len(steps) <= 6:
        where = "steps " + ", ".join(map(str, steps))
    else:
        where = f"{len(steps)} steps from {steps[0]} to {steps[-1]}"
    return _load_weights(run_dir, checkpoint_path(run_dir, step), device,
                         f"the run in {run_dir} saved weights at {where}")


def _load_weights(run_dir: Path, path: Path, device: str, missing: str
                  ) -> tuple[RunConfig, AttentionStack]:
    """The config of the finished run in ``run_dir`` and an ensemble of one holding the weights
    that ``save_member`` wrote to ``path``; ``missing`` says why when there is no such file."""
    if not folders.check_complete(run_dir):
        raise ResultsError(f"{run_dir} holds no finished run (it has no completion record).")
    cfg = build_run_config(read_json(run_dir / "config.json"))
    if not path.is_file():
        raise ResultsError(f"{path} does not exist; {missing}.")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
        model.load_state_dict({name: w.unsqueeze(0) for name, w in state.items()})
    except Exception as exc:  # torch raises many types for a broken file; name the file instead
        raise ResultsError(f"{path} is corrupted or does not match {run_dir / 'config.json'} "
                           f"({type(exc).__name__}); delete that run folder to redo it.") from None
    return cfg, model.to(device)


def train_runs(
    cfgs: Sequence[RunConfig],
    run_dirs: Sequence[Path] | None = None,
    *,
    progress: bool | None = None,
    description: str = "train",
) -> list[dict[str, Any]]:
    """Train one model per config as one ensemble; return each run's summary dict.

    See ``train_ensemble``, which also returns the trained ensemble.
    """
    return train_ensemble(cfgs, run_dirs, progress=progress, description=description)[0]


def train_ensemble(
    cfgs: Sequence[RunConfig],
    run_dirs: Sequence[Path] | None = None,
    *,
    progress: bool | None = None,
    description: str = "train",
) -> tuple[list[dict[str, Any]], AttentionStack]:
    """Train one model per config as one ensemble; return the summaries and the ensemble.

    With ``run_dirs`` (one per config), a ``RunWriter`` writes run e's folder as it trains: the
    marker and ``config.json`` at the start, a ``metrics.jsonl`` row every ``train.log_every``
    steps and at its stop step, with ``train.save_every`` its weights at every multiple of it and
    at its stop step (``checkpoint_path``: the weights at step s are those of the log row of step
    s), and ``attention.npz``, ``model.pt`` and ``summary.json`` when it stops, then its
    completion record, last (``sinklab.runs.folders.seal``). No figure is drawn: ``sinklab plot``
    draws ``attention.png`` from these files later (``sinklab.plots.plot_runs``).
    ``progress=None`` shows a bar only when stderr is a terminal. A tiny step trains with one
    thread (``step_threads``); the caller's thread setting is restored afterwards. An ensemble
    that would not fit in memory (``sinklab.runs.limits``) is refused before anything is allocated.
    """
    cfgs = list(cfgs)
    check_compatible(cfgs)
    cfg = cfgs[0]
    n = len(cfgs)
    if run_dirs is not None and len(run_dirs) != n:
        raise ValueError(f"run_dirs has {len(run_dirs)} entries and cfgs {n}; give one run folder "
                         "per config.")
    device = resolve_device(cfg.train.device)
    limits.check_run(cfg, n, device=device)
    keep_freed_memory()
    model = build_ensemble(cfgs, device)
    test = eval_batch(cfg, device)
    engine = model.engine(cfg.task.seq_len)  # what computes the attention (sinklab.kernels)
    writers = [] if run_dirs is None else [RunWriter.start(d, c) for d, c in zip(run_dirs, cfgs)]

    gens = [torch.Generator(device=device).manual_seed(derive_seed(c.train.seed, "data"))
            for c in cfgs]
    stream = TrainStream(cfg.task, cfg.train.batch_size, gens, residual=cfg.residual)
    lr = torch.tensor([c.train.lr for c in cfgs], device=device)
    opt = MemberAdam(list(model.parameters()), lr, (cfg.train.beta1, cfg.train.beta2),
                     cfg.train.adam_eps)
    active = torch.ones(n, dtype=torch.bool, device=device)
    summaries: list[dict[str, Any] | None] = [None] * n
    start = time.perf_counter()
    tol, max_steps, log_every = cfg.train.tol, cfg.train.max_steps, cfg.train.log_every
    save_every = cfg.train.save_every if writers else 0
    plateau = Plateau(cfg.train.patience, n, device, opt.flat.dtype) if cfg.train.patience \
        else None
    # Learning-rate drops left per member, and the steps at which each dropped (on the host).
    drops = torch.full((n,), cfg.train.lr_drops, device=device) if cfg.train.lr_drops else None
    dropped: list[list[int]] = [[] for _ in range(n)]
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=max_steps, desc=description, unit="step", disable=not show, leave=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(step_threads(cfg, n, device))

    def finish(members: list[int], step: int, status: dict[int, int], loss: Tensor,
               linf: Tensor) -> None:
        # A member that stops at step s has had exactly s updates (steps 0..s-1).
        train_time = time.perf_counter() - start
        finished = _select(model, members)
        index = torch.tensor(members, device=loss.device)
        training = metrics.Training(
            steps=torch.full((len(members),), step),
            converged=torch.tensor([status[e] == CONVERGED for e in members]),
            loss=loss.detach()[index], linf=linf[index],
            time_s=torch.full((len(members),), train_time, dtype=torch.float64))
        evals, maps = evaluate(finished, test, training)  # every metric (sinklab.metrics)
        rates = opt.lrs()
        for i, e in enumerate(members):
            summaries[e] = _summary(cfg, cfgs[e], STATUS[status[e]], evals[i],
                                    time.perf_counter() - start, device, engine)
            if drops is not None:  # absent without drops: such a summary is what it always was
                summaries[e]["lr_drop_steps"] = dropped[e]
                summaries[e]["lr_final"] = rates[e]
            if writers:
                writers[e].finish(finished, i, step, summaries[e], mean=maps["mean"][i],
                                  std=maps["std"][i])

    # Every layer in one kernel call where it applies (sinklab.kernels.TrainStep), else autograd.
    fused = kernels.TrainStep.build(model, opt, cfg.task.seq_len)
    try:
        for step in range(max_steps + 1):
            batch = stream.next()
            x, y, trigger = batch.x, batch.y, batch.trigger  # (E, B, L, d), (E, B)
            if fused is not None:
                loss, linf, patterns = fused(x, y, keep=step % log_every == 0)
            else:
                out = model(x, return_weights=True)
                err = out.out - y
                loss = err.pow(2).mean(dim=(1, 2, 3))  # (E,): each member's own MSE
                linf = err.detach().abs().amax(dim=(1, 2, 3))  # not part of the graph
                patterns = out.seen()  # as the heads' outputs see them (a gate's share)
            # Stop rule, on the device: converged, diverged (NaN or inf), on a plateau, or out
            # of steps, in that order of precedence.
            done = (linf < tol) | ~torch.isfinite(loss)
            stalled = None if plateau is None else plateau.update(step, linf)
            if drops is not None and step < max_steps:
                # A plateau with drops left lowers the rate instead of stopping the member; the
                # stop rule and divergence still take precedence.
                dropping = stalled & active & (drops > 0) & ~done
                if dropping.any():
                    stalled = stalled & ~dropping
                    drops = drops - dropping.long()
                    plateau.restart(dropping, step)
                    opt.scale_lr(dropping, cfg.train.lr_drop_factor)
                    for e in dropping.nonzero().flatten().tolist():
                        dropped[e].append(step)
            if stalled is not None:
                done = done | stalled
            stopping = active & done if step < max_steps else active
            if save_every and step % save_every == 0:  # before any member is sealed
                for e in active.nonzero().flatten().tolist():
                    writers[e].checkpoint(model, e, step)
            if stopping.any():  # one host read per step: free on a CPU
                codes = stop_codes(linf, loss, tol, stalled)
                status = {e: int(codes[e]) for e in stopping.nonzero().flatten().tolist()}
                if patterns is None:  # the same step again, keeping its weights this time
                    loss, linf, patterns = fused(x, y, keep=True)
                _log_rows(writers, list(status), step, loss, linf, patterns, trigger, status)
                finish(list(status), step, status, loss, linf)
                opt.freeze(list(status))
                active = active & ~stopping
                if not active.any():
                    break
            if step % log_every == 0:
                running = active.nonzero().flatten().tolist()
                _log_rows(writers, running, step, loss, linf, patterns, trigger, {})
            if fused is None:  # (the whole step has put its gradients in opt.grad already)
                opt.zero_grad()
                loss.sum().backward()  # members are independent: each gets its own gradient
            opt.step()
            bar.update(1)
            if show and step % 50 == 0:
                best = linf.masked_fill(~active, math.inf).min().item()
                bar.set_postfix(active=int(active.sum()), linf=f"{best:.2e}")
    finally:
        torch.set_num_threads(threads)
        bar.close()
        for writer in writers:
            writer.close()
    return [s for s in summaries if s is not None], model


def _log_rows(writers: Sequence[RunWriter], members: list[int], step: int, loss: Tensor,
              linf: Tensor, patterns: list[Tensor], trigger: Tensor,
              status: dict[int, int]) -> None:
    """Log step ``step`` of each of ``members``: its loss and L-infinity error (members,) and its
    BOS mass per layer and head (``patterns``: a layer's weights (E, B, H, L, L)) on the training
    batch, and its status (``STATUS``) when it stops at this step. Nothing without writers."""
    if not writers:
        return
    bos = torch.stack([metrics.bos_mass_nontrigger(w, trigger) for w in patterns], dim=1)
    for e in members:
        row = {"step": step,
               "loss": loss[e].item(), "train_linf": linf[e].item(),
               "bos_mass_nontrigger": bos[e].tolist()}
        if e in status:
            row["status"] = STATUS[status[e]]
        writers[e].log(row)


def _summary(cfg: RunConfig, member: RunConfig, status: str, values: dict[str, Any],
             wall_time_s: float, device: torch.device, engine: str) -> dict[str, Any]:
    """A stopped member's summary (``summary.json``): the ensemble's setting ``cfg``, the
    member's seed and lr, how it ended, its metrics ``values`` (``sinklab.evaluate.evaluate``)
    and where it ran."""
    args = {"attention_args": cfg.model.attention_args} if cfg.model.attention_args \
        else {}  # absent when empty: a default run's summary is what it always was
    return {
        "attention": cfg.model.attention, **args, "n_layers": cfg.model.n_layers,
        "n_heads": cfg.model.n_heads, "seq_len": cfg.task.seq_len,
        "d_model": cfg.task.d_model, "seed": member.train.seed, "lr": member.train.lr,
        "status": status,
        **values,
        "eval": {"n_sequences": cfg.eval.n_sequences, "trigger": cfg.task.eval_trigger,
                 "seed": cfg.eval.seed},
        "wall_time_s": wall_time_s,
        "device": str(device), "engine": engine,
        "versions": versions(),
        "summary_format": metrics.SUMMARY_FORMAT,  # sink rates are shares (metrics.in_shares)
    }
