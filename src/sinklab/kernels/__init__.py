"""A fused CPU kernel for the paper's attention-only models, built at run time when it can be.

``attention.c`` computes one layer's forward and backward pass (sinklab.model.Attention's
folded products, the softmax or ReLU rule, and their gradients) sequence by sequence in vector
registers, instead of the dozen batched products and elementwise passes PyTorch needs
(``FusedAttention``, the autograd path), and every layer of an attention-only stack's training
step in one call: forward, residual adds, loss and L-infinity error and backward
(``TrainStep``, which ``sinklab.train`` uses wherever it applies). ``benchmarks/train_speed.py``
and ``benchmarks/whole_step.py`` measure what they gain.

Ensemble members are split across torch's threads (``torch.get_num_threads()``), which
changes no result: each member is computed on its own.

It is compiled once per (seq_len, d_model) with the system's C compiler (``$CC``, else ``cc``)
for this machine's vector instructions and cached under ``$SINKLAB_CACHE`` (default
``~/.cache/sinklab``). Where there is no compiler, the build fails, or ``SINKLAB_KERNEL=0``, the
model uses PyTorch's operators; ``engine()`` says which one a configuration gets, and every run's
summary records it. The two engines compute the same mathematics in a different floating-point
order: ``tests/engine/test_kernels.py`` compares gradients and 200 training steps.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sinklab.attention import registry

SOURCE = Path(__file__).with_name("attention.c")
MAX_SIZE = 16  # seq_len and d_model must each fit in one 16-lane vector
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC")
ENV = "SINKLAB_KERNEL"

_disabled = 0  # nesting depth of ``disabled()``


def _cache_dir() -> Path:
    return Path(os.environ.get("SINKLAB_CACHE") or Path.home() / ".cache" / "sinklab") / "kernels"


def _cpu_id() -> str:
    """What -march=native compiles for: the first CPU's model name and instruction-set flags
    (a virtual machine may hide some flags of the same model), or the platform."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    found = {}
    for line in lines:
        key = line.partition(":")[0].strip()
        if key in ("model name", "flags"):
            found.setdefault(key, line)
    return "\n".join(found.values()) or platform.processor() or platform.machine()


@functools.cache
def _library(seq_len: int, d_model: int) -> ctypes.CDLL | None:
    """The kernel compiled for this shape, from the cache or built now; None if it cannot be."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        return None
    defines = (f"-DT={seq_len}", f"-DD={d_model}")
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, *FLAGS, *defines,
                                    _cpu_id()]).encode()).hexdigest()[:16]
    path = _cache_dir() / f"attention-{seq_len}x{d_model}-{key}.so"
    if not path.is_file():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
            os.close(fd)
            try:
                subprocess.run([compiler, *FLAGS, *defines, str(SOURCE), "-o", tmp],
                               check=True, capture_output=True, timeout=120)
                os.replace(tmp, path)  # atomic: a concurrent build leaves one complete file
            finally:
                Path(tmp).unlink(missing_ok=True)
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.sinklab_attention_forward.argtypes = [i64, i64, i32, i32] + [ptr] * 8
    lib.sinklab_attention_backward.argtypes = [i64, i64, i32, i32] + [ptr] * 11
    lib.sinklab_train_step.argtypes = [i64] * 4 + [i32] * 4 + [ptr] * 9
    return lib


def kernel_code(rule: str) -> int | None:
    """The code the kernel computes the rule ``rule`` by (at its default keyword arguments),
    as its registration records it (``RuleInfo.kernel_code``: softmax 0, ReLU 1); None for a
    rule the kernel does not compute, or no rule of that name."""
    info = registry.RULES.get(rule)
    return None if info is None else info.kernel_code


def engine(rule: str, seq_len: int, d_model: int, device: torch.device | str = "cpu",
           dtype: torch.dtype = torch.float32, rule_args: dict[str, Any] | None = None) -> str:
    """``"kernel"`` when this configuration's attention runs on the fused kernel, else
    ``"pytorch"``: CPU, float32, a rule it knows with every keyword argument (``rule_args``) at
    its default, seq_len and d_model up to 16, a C compiler, and not switched off
    (``SINKLAB_KERNEL=0`` or ``disabled()``)."""
    usable = (not _disabled and os.environ.get(ENV, "1") != "0"
              and torch.device(device).type == "cpu" and dtype == torch.float32
              and kernel_code(rule) is not None
              and not registry.rule_info(rule).non_default(rule_args or {})
              and 1 <= seq_len <= MAX_SIZE and 1 <= d_model <= MAX_SIZE)
    return "kernel" if usable and _library(seq_len, d_model) is not None else "pytorch"


@contextmanager
def disabled():
    """Use PyTorch's operators inside this block (tests compare the two engines)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1) - 1),
                              thread_name_prefix="sinklab-kernel")


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has none of its threads


def _by_members(fn: Any, n_members: int, batch: int, scalars: tuple[int, ...],
                tensors: tuple[Tensor, ...]) -> None:
    """Call ``fn(EB, B, *scalars, *pointers)`` over every member, split into contiguous member
    ranges run side by side, one per torch thread (``torch.get_num_threads()``, at most one per
    member). ``tensors`` are contiguous with a leading member axis (or member-major first
    axis). Members share no sum, so the split leaves every bit as it is; ctypes releases the
    GIL while the kernel runs."""
    def call(lo: int, hi: int) -> None:
        pointers = [ctypes.c_void_p(t.data_ptr() + lo * (t.numel() // n_members)
                                    * t.element_size()) for t in tensors]
        if fn((hi - lo) * batch, batch, *scalars, *pointers):
            raise MemoryError("sinklab's attention kernel could not allocate its workspace")

    _split_members(n_members, call)


def _split_members(n_members: int, call: Any) -> None:
    """Run ``call(lo, hi)`` over contiguous member ranges covering 0..n_members, side by side,
    one per torch thread (at most one per member); this thread takes the first range."""
    parts = min(torch.get_num_threads(), n_members)
    bounds = [n_members * i // parts for i in range(parts + 1)]
    later = [_pool().submit(call, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    call(bounds[0], bounds[1])
    for future in later:
        future.result()


class FusedAttention(torch.autograd.Function):
    """(x (E, B, T, d), A, M (E, H, d, d)) -> output (E, B, T, d), and the scores and weights
    (E, B, H, query, key) as sinklab.model.Attention returns them (views of (E * B, H, key,
    query) buffers); gradients flow to x, A and M."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, m: Tensor, rule: str) -> tuple[Tensor, ...]:
        n_members, batch, seq, d = x.shape
        n_heads = a.shape[1]
        lib = _library(seq, d)
        x, a, m = x.contiguous(), a.contiguous(), m.contiguous()
        eb = n_members * batch
        out = torch.empty_like(x)
        scores = x.new_empty(eb, n_heads, seq, seq)  # (head, key, query)
        weights = torch.empty_like(scores)
        q = x.new_empty(eb, n_heads, seq, d)
        v = torch.empty_like(q)
        _by_members(lib.sinklab_attention_forward, n_members, batch, (n_heads, kernel_code(rule)),
                    (x, a, m, out, scores, weights, q, v))
        ctx.save_for_backward(x, a, m, scores, weights, q, v)
        ctx.rule = rule
        ctx.mark_non_differentiable(scores, weights)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the scores and weights
        per_head = (n_members, batch, n_heads, seq, seq)
        return out, scores.view(per_head).transpose(3, 4), weights.view(per_head).transpose(3, 4)

    @staticmethod
    def backward(ctx: Any, g: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        x, a, m, scores, weights, q, v = ctx.saved_tensors
        n_members, batch, seq, d = x.shape
        g = g.contiguous()
        gx, ga, gm = torch.empty_like(x), torch.empty_like(a), torch.empty_like(m)
        _by_members(_library(seq, d).sinklab_attention_backward, n_members, batch,
                    (a.shape[1], kernel_code(ctx.rule)),
                    (x, a, m, scores, weights, q, v, g, gx, ga, gm))
        return gx, ga, gm, None


class TrainStep:
    """The training step of an attention-only stack with its layers on the kernel in one call:
    every layer forward, the residual adds, each member's MSE loss and L-infinity error, and
    every layer back again, one sequence at a time while its activations are in cache, giving
    the gradients of the folded weights A = W_Q W_K^T and M = W_V W_O. The folds, their
    gradients to W_Q, W_K, W_V and W_O, and Adam (``opt.step()``) stay PyTorch's, computed by
    the same operations as the autograd path, and the layers are ``FusedAttention``'s C
    functions, so a step gives the autograd path's numbers bit for bit. ``build`` says whether
    a model can use it.

        step = TrainStep.build(model, opt, seq_len)
        loss, linf, patterns = step(x, y, keep=True)  # patterns: per layer (E, B, H, Q, K)
        opt.step()                                     # the gradients are in opt.grad
    """

    def __init__(self, model: Any, opt: Any, seq_len: int) -> None:
        self.model, self.opt = model, opt
        self.n_members, self.n_layers = model.n_members, len(model.blocks)
        self.n_heads, self.seq_len, self.d_model = model.cfg.n_heads, seq_len, model.d_model
        self.rule, self.residual = kernel_code(model.cfg.attention), int(model.residual)
        self.lib = _library(seq_len, model.d_model)
        shape = (self.n_layers, self.n_members, self.n_heads, self.d_model, self.d_model)
        ref = opt.flat
        self.folds = ref.new_empty((2, *shape))  # A and M of every layer, as the kernel reads them
        self.fold_grads = torch.empty_like(self.folds)
        self.loss = ref.new_empty(self.n_members)
        self.linf = torch.empty_like(self.loss)
        self._keep: Tensor | None = None  # (L, E * B, H, key, query), made on first use

    @classmethod
    def build(cls, model: Any, opt: Any, seq_len: int) -> TrainStep | None:
        """The step for ``model`` (an ``AttentionStack``) trained by ``opt`` (a
        ``sinklab.train.MemberAdam`` over its parameters), or None where it cannot run on the
        kernel: another block than ``attention``, a layer off the kernel
        (``AttentionStack.engine``), or a rule with parameters of its own."""
        if model.cfg.block != "attention" or model.engine(seq_len) != "kernel":
            return None
        if len(list(model.parameters())) != 4 * len(model.blocks):
            return None
        return cls(model, opt, seq_len)

    def __call__(self, x: Tensor, y: Tensor, keep: bool = False
                 ) -> tuple[Tensor, Tensor, list[Tensor] | None]:
        """x, y (E, B, T, d) -> each member's loss and L-infinity error (E,) and, with
        ``keep``, every layer's weights (E, B, H, query, key) on this batch. The gradients of
        every weight are written into the optimiser's gradient buffer. The returned tensors are
        this object's buffers, overwritten by the next call."""
        n, batch = self.n_members, x.shape[1]
        x, y = x.contiguous(), y.contiguous()
        blocks = [b.attn for b in self.model.blocks]
        with torch.no_grad():  # the folds, as Attention.forward computes them
            for layer, attn in enumerate(blocks):
                torch.matmul(attn.w_q, attn.w_k.transpose(-1, -2), out=self.folds[0, layer])
                torch.matmul(attn.w_v, attn.w_o, out=self.folds[1, layer])
        shape = (self.n_layers, n * batch, self.n_heads, self.seq_len, self.seq_len)
        if keep and (self._keep is None or self._keep.shape != shape):
            self._keep = x.new_empty(shape)
        kept = ctypes.c_void_p(self._keep.data_ptr() if keep else 0)
        scalars = (n, batch, self.n_heads, self.n_layers, self.rule, self.residual)
        pointers = [ctypes.c_void_p(t.data_ptr()) for t in
                    (self.folds[0], self.folds[1], self.fold_grads[0], self.fold_grads[1], x, y,
                     self.loss, self.linf)] + [kept]

        def call(lo: int, hi: int) -> None:
            if self.lib.sinklab_train_step(scalars[0], lo, hi, *scalars[1:], *pointers):
                raise MemoryError("sinklab's training kernel could not allocate its workspace")

        _split_members(n, call)
        with torch.no_grad():  # the folds' gradients, as autograd's bmm backward computes them
            eh, d = n * self.n_heads, self.d_model
            for layer, attn in enumerate(blocks):
                ga, gm = (g.view(eh, d, d) for g in self.fold_grads[:, layer])
                wq, wk, wv, wo = (w.view(eh, d, d) for w in (attn.w_q, attn.w_k, attn.w_v,
                                                             attn.w_o))
                torch.bmm(ga, wk, out=attn.w_q.grad.view(eh, d, d))
                attn.w_k.grad.view(eh, d, d).copy_(torch.bmm(wq.transpose(1, 2), ga)
                                                   .transpose(1, 2))
                torch.bmm(gm, wo.transpose(1, 2), out=attn.w_v.grad.view(eh, d, d))
                torch.bmm(wv.transpose(1, 2), gm, out=attn.w_o.grad.view(eh, d, d))
        patterns = None
        if keep:
            per_head = (n, batch, self.n_heads, self.seq_len, self.seq_len)
            patterns = [w.view(per_head).transpose(3, 4) for w in self._keep]
        return self.loss, self.linf, patterns
