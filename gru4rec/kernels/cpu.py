"""The fused CPU kernels of the training step (``cpu_kernels.c``) on tensors.

Eager PyTorch updates the rows of an item table as a chain of whole-tensor operations (gather
each state table, five or six passes, scatter each back): a dozen passes over memory and as many
operator calls per table and step, where one pass suffices. ``cpu_kernels.c`` does that one pass
(and makes rows unique, sums and spreads score columns per item, runs the GRU cell's elementwise
work, the XE/BPR-max losses and the dropout masks' threshold; one call updates all of an
optimiser's tables, :class:`TablesUpdate`) in plain C with OpenMP. It is built on first use
(:mod:`gru4rec.kernels.build`) and loaded with ctypes by :func:`cpu_kernels`. Where no compiler
works, training warns once and runs the PyTorch path, which gives the same results more slowly;
``GRU4REC_CPU_KERNELS=0`` turns the kernels off.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gru4rec.kernels.build import KernelBuildError, build_library
from gru4rec.kernels.c_args import FLOAT as _f32
from gru4rec.kernels.c_args import I64 as _I64
from gru4rec.kernels.c_args import INT64 as _i64
from gru4rec.kernels.c_args import VOIDP as _p
from gru4rec.kernels.c_args import check_float, check_index, check_matrix, check_scores, optional_float
from gru4rec.kernels.cpu_composed import ComposedTables
from gru4rec.kernels.switches import cpu_kernels_allowed

__all__ = ["LAYER_FIELDS", "MAX_LAYERS", "METHODS", "CpuKernels", "GuidedSearch", "KernelBuildError", "StepStruct",
           "StructLayoutError", "TableUpdate", "TablesUpdate", "check_layout", "cpu_kernels", "load_kernels", "lost_fast_path",
           "sgemm_binding"]

log = logging.getLogger(__name__)

#: Optimiser methods as the kernels number them: cpu_kernels.c's ``method`` and the Triton
#: kernels' compile-time ``METHOD`` (:mod:`gru4rec.kernels.triton_rule`), one numbering for both.
METHODS = {"sgd": 0, "adagrad": 1, "rmsprop": 2, "adadelta": 3, "adam": 4}



class _Rule(ctypes.Structure):
    """``rule_t`` of cpu_kernels.c (checked against it when the library loads: :func:`check_layout`)."""

    _fields_ = (
        [(name, _p) for name in ("p", "acc", "dacc", "m", "vel")]
        + [(name, _i64) for name in ("width", "method")]
        + [(name, _f32) for name in ("lr", "momentum", "lmbd", "decay", "gain", "beta1_gain", "bias1", "bias2", "eps")]
    )


#: The layers ``step_t`` has room for (cpu_step.c's ``MAX_LAYERS``).
MAX_LAYERS = 8
#: ``step_t``'s per-layer pointer arrays, in its order.
LAYER_FIELDS = ("Wx", "Wrz", "Wh", "Bh", "gWx", "gWrz", "gWh", "gBh", "hidden", "mask", "v", "rz", "hr", "c", "out")


class StepStruct(ctypes.Structure):
    """``step_t`` of cpu_step.c: the one-call training step's bindings, filled by
    :class:`gru4rec.training.cpu_step.FusedCpuStep` (checked against C when the library loads)."""

    _fields_ = (
        [("sgemm", _p)]
        + [(name, _i64) for name in ("B", "S", "N", "d", "n_layers", "logit_form", "mask_in_bias", "bpr_max", "has_elu")]
        + [(name, _f32) for name in ("bpreg", "elu_alpha")]
        + [("n", _i64 * MAX_LAYERS)]
        + [(name, _p * MAX_LAYERS) for name in LAYER_FIELDS]
        + [(name, _p) for name in ("Wy", "By", "logq_in", "logq_sample", "embed_mask",
                                   "rule_dense", "rule_wy", "rule_by", "g_dense")]
        + [("n_dense", _i64)]
        + [(name, _p) for name in ("cols", "rows_all", "uniq", "inverse", "slot", "mark",
                                   "col_valid", "wy", "bias", "x0", "s", "scores", "g_rows", "g_out", "dv", "t", "w",
                                   "g_wy", "g_by", "grad")]
    )


class _Field(ctypes.Structure):
    """``g4r_field_t`` of cpu_kernels.h: one row of a structure's layout table."""

    _fields_ = [("name", ctypes.c_char_p), ("offset", _i64), ("size", _i64)]


class StructLayoutError(RuntimeError):
    """A C structure and its ctypes mirror disagree: a field added, moved or resized on one side
    only. Filling the mirror would write where C reads something else, so the kernels refuse to load."""


def check_layout(layout: Callable[..., int], c_name: str, mirror: type[ctypes.Structure]) -> None:
    """Compare the layout that C reports (``layout``: a ``g4r_layout_*`` function filling its
    field table and size) with ``mirror``'s: every field's offset and size, and the structure's
    size. Raises :class:`StructLayoutError` naming the structure and the first field (in C's
    order) that differs."""
    table = ctypes.POINTER(_Field)()
    size = ctypes.c_int64()
    n = layout(ctypes.byref(table), ctypes.byref(size))
    in_c = {table[i].name.decode(): (table[i].offset, table[i].size) for i in range(n)}
    in_py = {name: (getattr(mirror, name).offset, getattr(mirror, name).size) for name, *_ in mirror._fields_}
    where = f"{c_name} (C) and its ctypes mirror {mirror.__name__} ({__name__})"
    # C's order, then fields only the mirror has: the first difference is the field to fix
    for name in [*in_c, *(name for name in in_py if name not in in_c)]:
        c, py = in_c.get(name), in_py.get(name)
        if c == py:
            continue
        if c is None:
            raise StructLayoutError(f"{where} disagree at field {name!r}: C has no such field")
        if py is None:
            raise StructLayoutError(f"{where} disagree at field {name!r}: the mirror has no such field")
        raise StructLayoutError(f"{where} disagree at field {name!r}: offset {c[0]}, {c[1]} bytes in C; "
                                f"offset {py[0]}, {py[1]} bytes in the mirror")
    if size.value != ctypes.sizeof(mirror):
        raise StructLayoutError(f"{where} disagree in size: {size.value} bytes in C, {ctypes.sizeof(mirror)} in the mirror")


class TableUpdate:
    """The optimiser's update of one float32 table and its state, bound once (layouts checked
    here); each call checks only what changes — the row indices and the gradient."""

    def __init__(self, fn: Callable[..., int], p: Tensor, state: dict[str, Tensor | None], method: str, **constants: float) -> None:
        self._fn = fn
        self.width = p.shape[1] if p.dim() == 2 else 1
        self.n_rows = p.numel() // max(self.width, 1)
        self._tensors: list[Tensor | None] = [p, *(state.get(k) for k in ("acc", "dacc", "m", "vel"))]  # kept alive with the addresses
        need = {"acc": method != "sgd", "dacc": method == "adadelta", "m": method == "adam", "vel": constants.get("momentum", 0.0) > 0}
        for key, t in zip(("p", "acc", "dacc", "m", "vel"), self._tensors):
            if t is not None:
                check_float(t, key, p.numel())
            elif need.get(key, True):
                raise ValueError(f"the {method} update needs the state table {key!r}")
        self._ptrs = [t.data_ptr() if t is not None else None for t in self._tensors]
        #: The table and its state tables, with the addresses the rule holds (:meth:`check`).
        self.bound = [(t, t.data_ptr()) for t in self._tensors if t is not None]
        self.rule = _Rule(*self._ptrs, self.width, METHODS[method])
        for name, value in constants.items():
            setattr(self.rule, name, value)
        self._rule_ref = ctypes.byref(self.rule)
        #: The rule's address, as :class:`TablesUpdate` hands it to C.
        self.rule_ptr = ctypes.cast(self._rule_ref, ctypes.c_void_p).value

    def check(self, rows: Tensor | None, g: Tensor) -> int:
        """The number of rows an update from ``rows`` and ``g`` takes (see :meth:`__call__`),
        after checking them and that no table has moved."""
        for t, ptr in self.bound:
            if t.data_ptr() != ptr:
                raise RuntimeError("a table of the fused update has moved in memory since the optimiser was built")
        n = self.n_rows if rows is None else check_index(rows, "rows", self.n_rows)
        check_float(g, "g", n * self.width)
        return n

    def __call__(self, rows: Tensor | None, g: Tensor, bias1: float | None = None, bias2: float | None = None) -> None:
        """Update the table at ``rows`` (unique; gradient row k belongs to ``rows[k]``), or all of
        it when ``rows`` is None, from ``g`` (overwritten). ``bias1``/``bias2``: Adam's
        corrections 1 − β^t of this step."""
        n = self.check(rows, g)
        if bias1 is not None:
            self.rule.bias1, self.rule.bias2 = bias1, bias2
        self._fn(self._rule_ref, n, None if rows is None else rows.data_ptr(), g.data_ptr())


class TablesUpdate:
    """Several :class:`TableUpdate` (an optimiser's dense buffer and item tables) in one call:
    one parallel region for all of them instead of one per table, the same arithmetic."""

    def __init__(self, fn: Callable[..., None], updates: dict[str, TableUpdate]) -> None:
        self._fn = fn
        self.updates = updates
        n = len(updates)
        # the C arguments, filled in place each call (no ctypes objects built per step)
        self._rules = (ctypes.c_void_p * n)()
        self._n_rows = (ctypes.c_int64 * n)()
        self._rows = (ctypes.c_void_p * n)()
        self._g = (ctypes.c_void_p * n)()

    def __call__(self, grads: dict[str, tuple[Tensor | None, Tensor]], bias1: float | None = None, bias2: float | None = None) -> None:
        """Update each named table from its (rows, g), as :meth:`TableUpdate.__call__` does."""
        if len(grads) > len(self._rules):
            raise ValueError(f"at most {len(self._rules)} tables, got {len(grads)}")
        if bias1 is not None and bias2 is not None:
            self.set_bias(bias1, bias2)
        for i, (name, (rows, g)) in enumerate(grads.items()):
            update = self.updates[name]
            self._n_rows[i] = update.check(rows, g)
            self._rules[i] = update.rule_ptr
            self._rows[i] = None if rows is None else rows.data_ptr()
            self._g[i] = g.data_ptr()
        self._fn(len(grads), self._rules, self._n_rows, self._rows, self._g)

    def set_bias(self, bias1: float, bias2: float) -> None:
        """Adam's corrections 1 − β1^t and 1 − β2^t of this step, on every table's rule."""
        for update in self.updates.values():
            update.rule.bias1, update.rule.bias2 = bias1, bias2


#: Guide entries per item of :class:`GuidedSearch`, and at most this many (16 MB).
GUIDE_PER_ITEM, MAX_GUIDE = 4, 1 << 21


class GuidedSearch:
    """Inverse-CDF lookups in one cumulative distribution (``g4r_inverse_cdf``): its guide table
    is built once, here; each call fills ``out`` with ``torch.searchsorted(cdf, u, right=True)``."""

    def __init__(self, fn: Callable[..., None], cdf: Tensor) -> None:
        if cdf.dtype is not torch.float64 or not cdf.is_cpu or not cdf.is_contiguous() or cdf.dim() != 1 or cdf.numel() == 0:
            raise ValueError(f"cdf must be a non-empty contiguous 1-D float64 CPU tensor, got {cdf.dtype} {tuple(cdf.shape)} "
                             f"on {cdf.device}")
        self._fn = fn
        self.cdf = cdf
        n = min(GUIDE_PER_ITEM * cdf.numel(), MAX_GUIDE)
        #: The answer for k / n at each k: with 4 entries per item most draws need no step at all
        #: (10M draws: 43 ms with one entry per item, 19 ms with 4, 14 with 8, on rsc15's items).
        self.guide = torch.searchsorted(cdf, torch.arange(n, dtype=torch.float64) / n, right=True)

    def __call__(self, u: Tensor, out: Tensor) -> None:
        """``out`` (int64, as many as ``u``) = the first index whose cdf exceeds each of ``u`` (float64)."""
        n = u.numel()
        if u.dtype is not torch.float64 or not u.is_cpu or not u.is_contiguous():
            raise ValueError(f"u must be a contiguous float64 CPU tensor, got {u.dtype} on {u.device}")
        if out.dtype is not _I64 or not out.is_cpu or not out.is_contiguous() or out.numel() != n:
            raise ValueError(f"out must be a contiguous int64 CPU tensor of {n} elements")
        self._fn(n, u.data_ptr(), self.cdf.numel(), self.cdf.data_ptr(), self.guide.numel(), self.guide.data_ptr(), out.data_ptr())


#: The size of torch's CPU generator state (Generator.get_state()): the MT19937 record
#: ``g4r_mt19937_uniform`` advances (cpu_kernels.c), then torch's normal-sample caches.
_GENERATOR_STATE_BYTES = 5056


@functools.cache
def sgemm_binding() -> tuple[int | None, str]:
    """The address of ``sgemm_`` in the BLAS that torch's CPU library links (MKL) — the one-call
    step's products — or None and why it cannot be had (a torch-internals binding: found once)."""
    if sys.byteorder != "little":  # cpu_step.c passes 64-bit sizes to either BLAS integer width
        return None, f"a {sys.byteorder}-endian machine (the C step passes 64-bit sizes to sgemm_)"
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return ctypes.cast(ctypes.CDLL(path).sgemm_, ctypes.c_void_p).value, ""
    except OSError as exc:
        return None, f"torch's CPU library cannot be opened ({exc})"
    except AttributeError:
        return None, f"torch's CPU library ({path}) exports no sgemm_"


_lost: set[str] = set()


def lost_fast_path(what: str, cause: str, cost: str) -> None:
    """Say once per process, as a WARNING, that the fast path ``what`` is lost because of
    ``cause`` and what the run pays for it (``cost``): a run that silently got slower would
    otherwise be found only by timing it."""
    if what not in _lost:
        _lost.add(what)
        log.warning("gru4rec: %s is unavailable: %s; %s", what, cause, cost)


class TorchRand:
    """``torch.rand(out.shape, generator=g, out=out)`` for float32 CPU tensors — the same values
    and the same generator state after — by ``g4r_mt19937_uniform``: torch draws one scalar
    MT19937 output at a time (0.37 ms for a DIGINETICA step's 131,072 dropout draws); the kernel's
    vector loops take a fraction of that. It reads the state from ``get_state()`` and hands it
    back with ``set_state()`` (2 µs). :meth:`matches_torch` checks it once against torch.rand."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._matches: bool | None = None
        #: Why the kernel's draws are not torch's (after :meth:`matches_torch`), or "".
        self.why_not = ""

    def __call__(self, out: Tensor, generator: torch.Generator) -> None:
        check_float(out, "out", out.numel())
        state = generator.get_state()
        if generator.device.type != "cpu" or state.numel() != _GENERATOR_STATE_BYTES:
            raise ValueError(f"a CPU generator with a {_GENERATOR_STATE_BYTES}-byte state is needed, got "
                             f"{state.numel()} bytes on {generator.device}")
        self._fn(state.data_ptr(), out.numel(), out.data_ptr())
        generator.set_state(state)

    def matches_torch(self) -> bool:
        """Whether this torch's generator is the one the kernel knows: the draws and the states
        after them equal torch.rand's, from a fresh seed and mid-stream, across the state's
        twists (checked once)."""
        if self._matches is None:
            ours, theirs = torch.Generator().manual_seed(20161), torch.Generator().manual_seed(20161)
            self._matches = True
            try:
                for n in (1, 623, 700, 1, 1248, 5000):
                    a, b = torch.empty(n), torch.empty(n)
                    self(a, ours)
                    torch.rand(n, generator=theirs, out=b)
                    if not torch.equal(a, b) or not torch.equal(ours.get_state(), theirs.get_state()):
                        self._matches = False
                        self.why_not = (f"this torch's CPU generator (torch {torch.__version__}) draws other numbers than the "
                                        f"MT19937 state the kernel reads ({n} draws compared)")
                        break
            except (ValueError, RuntimeError) as exc:
                self._matches = False
                self.why_not = f"this torch's CPU generator state is not the one the kernel reads ({exc})"
        return self._matches


class CpuKernels:
    """The kernels of ``cpu_kernels.c`` on tensors. Every argument is checked (type, layout,
    size) before its address is handed to C: a wrong one is a ValueError, never a stray write."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path

        def c(name: str, *argtypes: Any, restype: Any = None) -> Callable[..., Any]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = list(argtypes), restype
            return fn

        self._update = c("g4r_update", _p, _i64, _p, _p)
        self._update_tables = c("g4r_update_tables", _i64, _p, _p, _p, _p)
        self._unique = c("g4r_unique", _i64, _p, _i64, _i64, _p, _p, _p, _p, _p, restype=_i64)
        self._sum_columns = c("g4r_sum_columns", _i64, _i64, _i64, _p, _p, _p)
        self._sum_rows = c("g4r_sum_rows", _i64, _i64, _p, _p)
        self._add_rows = c("g4r_add_rows", _i64, _p, _i64, _p, _p)
        self._compose_rows = c("g4r_compose_rows", _i64, _p, _i64, _p, _p, _p, _f32, _i64, _p, _p, _i64, _p, _p)
        self._code_grads = c("g4r_code_grads", _i64, _p, _i64, _p, _p, _p, _p, _i64, _p, _i64, _p, _i64, _p, _p, _p)
        self._column_bias = c("g4r_column_bias", _i64, _i64, _p, _p, _p, _p, _p, _p)
        self._gather_columns = c("g4r_gather_columns", _i64, _i64, _i64, _p, _p, _p, _p)
        self._gru_gates = c("g4r_gru_gates", _i64, _i64, _p, _p, _p)
        self._gru_output = c("g4r_gru_output", _i64, _i64, _p, _p, _p, _p, _p)
        self._gru_backward_out = c("g4r_gru_backward_out", _i64, _i64, _p, _p, _p, _p, _p, _p)
        self._gru_backward_reset = c("g4r_gru_backward_reset", _i64, _i64, _p, _p, _p, _p, _p)
        self._dropout_masks = c("g4r_dropout_masks", _i64, _i64, _p, _f32, _f32, _f32, _f32)
        self._cross_entropy = c("g4r_cross_entropy", _i64, _i64, _p, _p, _i64, _p)
        self._bpr_max = c("g4r_bpr_max", _i64, _i64, _p, _p, _p, _f32, _i64, _f32, _p, _p)
        self._inverse_cdf = c("g4r_inverse_cdf", _i64, _p, _i64, _p, _i64, _p, _p)
        #: torch.rand's draws by the kernel (:class:`TorchRand`).
        self.torch_rand = TorchRand(c("g4r_mt19937_uniform", _p, _i64, _p))
        #: The whole training step of :mod:`gru4rec.training.cpu_step` (its ``step_t`` and arguments are
        #: bound there), in one call.
        self.train_step_fn = c("g4r_train_step", _p, _p, _p, _p, _p, _p, _f32, _p, _p)
        # The structures Python fills for C, against their mirrors: now, before anything is bound.
        self.layouts = {"rule_t": (c("g4r_layout_rule", _p, _p, restype=_i64), _Rule),
                        "step_t": (c("g4r_layout_step", _p, _p, restype=_i64), StepStruct)}
        for c_name, (layout, mirror) in self.layouts.items():
            check_layout(layout, c_name, mirror)

    def table_update(self, p: Tensor, state: dict[str, Tensor | None], *, method: str, lr: float, momentum: float, lmbd: float,
                     decay: float = 0.0, beta1: float = 0.0, eps: float = 1e-6) -> TableUpdate:
        """The update (the rule of :mod:`gru4rec.training.optim`) of ``p`` and its ``state`` (``acc``,
        ``dacc``, ``m``, ``vel``: full-size tables, None where the method keeps none)."""
        # 1 − decay and 1 − β1 rounded from double, as PyTorch rounds the Python floats it is given
        return TableUpdate(self._update, p, state, method, lr=lr, momentum=momentum, lmbd=lmbd, decay=decay, gain=1.0 - decay,
                           beta1_gain=1.0 - beta1, bias1=1.0, bias2=1.0, eps=eps)

    def inverse_cdf(self, cdf: Tensor) -> GuidedSearch:
        """The negative sampler's draws from ``cdf`` (float64): ``searchsorted(cdf, u, right=True)``
        in about one step per draw instead of a binary search (:class:`GuidedSearch`)."""
        return GuidedSearch(self._inverse_cdf, cdf)

    def tables_update(self, updates: dict[str, TableUpdate]) -> TablesUpdate:
        """The named table updates (each from :meth:`table_update`) as one call per step."""
        return TablesUpdate(self._update_tables, updates)

    def unique(
        self, rows: Tensor, mark: Tensor, slot: Tensor, uniq: Tensor, inverse: Tensor, n_first: int | None = None
    ) -> tuple[int, int]:
        """The distinct values of ``rows`` into ``uniq`` and each position's index among them
        into ``inverse``; returns their number and how many of them occur in the first
        ``n_first`` positions (default: all). Those come first, in ascending order; values found
        only after position ``n_first`` follow in order of appearance. ``mark`` (uint8, all zero,
        left so) and ``slot`` (int64) are scratch tables over the ids; ``uniq`` and ``inverse``
        hold ``len(rows)``."""
        n_items = mark.numel()
        n = check_index(rows, "rows", n_items)
        n_first = n if n_first is None else n_first
        if not 0 <= n_first <= n:
            raise ValueError(f"n_first must be between 0 and {n}, got {n_first}")
        if mark.dtype not in (torch.uint8, torch.bool) or not mark.is_contiguous() or not mark.is_cpu:
            raise ValueError("mark must be a contiguous uint8 (or bool) CPU tensor")
        for t, name, size in ((slot, "slot", n_items), (uniq, "uniq", n), (inverse, "inverse", n)):
            if t.dtype is not _I64 or not t.is_contiguous() or not t.is_cpu or t.numel() < size:
                raise ValueError(f"{name} must be a contiguous int64 CPU tensor of at least {size} elements")
        k_first = ctypes.c_int64()
        k = self._unique(n, rows.data_ptr(), n_first, n_items, mark.data_ptr(), slot.data_ptr(), uniq.data_ptr(), inverse.data_ptr(),
                         ctypes.byref(k_first))
        return int(k), k_first.value

    def sum_columns(self, g: Tensor, group: Tensor, n_groups: int) -> Tensor:
        """``out[b, group[j]] = Σ_j g[b, j]`` (B × n_groups): the columns of ``g`` summed by group."""
        n_rows, n_cols = check_matrix(g, "g")
        if check_index(group, "group", n_groups) != n_cols:
            raise ValueError(f"group must have one entry per column of g ({n_cols})")
        out = torch.empty(n_rows, n_groups, dtype=torch.float32)
        self._sum_columns(n_rows, n_cols, n_groups, g.data_ptr(), group.data_ptr(), out.data_ptr())
        return out

    def sum_rows(self, g: Tensor) -> Tensor:
        """``out[j] = Σ_b g[b, j]`` (n_cols): the rows of ``g`` summed, in row order."""
        n_rows, n_cols = check_matrix(g, "g")
        out = torch.empty(n_cols, dtype=torch.float32)
        self._sum_rows(n_rows, n_cols, g.data_ptr(), out.data_ptr())
        return out

    def add_rows(self, table: Tensor, rows: Tensor, src: Tensor) -> None:
        """``table[rows[i]] += src[i]`` in place (repeated rows add up), as ``index_add_``."""
        n_rows, width = check_matrix(table, "table")
        n = check_index(rows, "rows", n_rows)
        check_float(src, "src", n * width)
        self._add_rows(n, rows.data_ptr(), width, src.data_ptr(), table.data_ptr())

    def composition(self, tables: list[Tensor], codes: list[Tensor]) -> ComposedTables:
        """The one-code attribute columns of composed item rows (``tables[c]``, read at
        ``codes[c][item]``) bound to the kernels that compose a step's rows and sum the tables'
        gradients (:class:`ComposedTables`)."""
        return ComposedTables(self._compose_rows, self._code_grads, tables, codes)

    def column_bias(self, cols: Tensor, n_in: int, by: Tensor, logq_in: Tensor | None, logq_sample: Tensor | None,
                    valid: Tensor | None) -> Tensor:
        """The bias of the score columns ``cols``: ``by[cols] − logq[cols] + (1 − valid)·MASK``,
        logq being ``logq_in`` for the first ``n_in`` columns and ``logq_sample`` for the rest
        (both None: no logQ); the mask term only where ``valid`` is given."""
        n_items = by.numel()
        check_float(by, "by", n_items)
        C = check_index(cols, "cols", n_items)
        if (logq_in is None) != (logq_sample is None) or not 0 <= n_in <= C:
            raise ValueError("logq_in and logq_sample go together, and n_in must be between 0 and len(cols)")
        out = torch.empty(C, dtype=torch.float32)
        self._column_bias(C, n_in, cols.data_ptr(), by.data_ptr(), optional_float(logq_in, "logq_in", n_items),
                          optional_float(logq_sample, "logq_sample", n_items), optional_float(valid, "valid", C), out.data_ptr())
        return out

    def gather_columns(self, s: Tensor, group: Tensor, bias: Tensor) -> Tensor:
        """``out[b, j] = s[b, group[j]] + bias[j]`` (B × len(group)): the reverse of
        :meth:`sum_columns`."""
        n_rows, n_src = check_matrix(s, "s")
        n_cols = check_index(group, "group", n_src)
        check_float(bias, "bias", n_cols)
        out = torch.empty(n_rows, n_cols, dtype=torch.float32)
        self._gather_columns(n_rows, n_src, n_cols, s.data_ptr(), group.data_ptr(), bias.data_ptr(), out.data_ptr())
        return out

    # The GRU cell with a tanh candidate (layouts of gru4rec/training/cell.py: rz = [r | z], dv = [cand | r | z]).

    def gru_gates(self, a: Tensor, h: Tensor) -> Tensor:
        """``a`` (B × 2n reset and update pre-activations) becomes ``rz = sigmoid(a)`` in place;
        returns ``h·r`` (B × n)."""
        B, n = check_matrix(h, "h")
        check_float(a, "a", B * 2 * n)
        hr = torch.empty(B, n, dtype=torch.float32)
        self._gru_gates(B, n, a.data_ptr(), h.data_ptr(), hr.data_ptr())
        return hr

    def gru_output(self, u: Tensor, h: Tensor, rz: Tensor, mask: Tensor | None) -> Tensor:
        """``u`` (B × n candidate pre-activation) becomes ``c = tanh(u)`` in place; returns the
        layer's output ``lerp(h, c, z)`` (times the dropout ``mask`` unless None)."""
        B, n = check_matrix(h, "h")
        check_float(u, "u", B * n)
        check_float(rz, "rz", B * 2 * n)
        out = torch.empty(B, n, dtype=torch.float32)
        self._gru_output(B, n, u.data_ptr(), h.data_ptr(), rz.data_ptr(), optional_float(mask, "mask", B * n), out.data_ptr())
        return out

    def gru_backward_out(self, d: Tensor, mask: Tensor | None, rz: Tensor, c: Tensor, h: Tensor) -> Tensor:
        """dL/dv (B × 3n) from ``d`` = dL/d(layer output): its candidate part ``d·z·(1 − c²)`` and
        update part ``d·(c − h)·z(1 − z)`` (``d`` times the dropout ``mask`` unless None); the
        reset part is left for :meth:`gru_backward_reset`."""
        B, n = check_matrix(h, "h")
        check_float(d, "d", B * n)
        check_float(rz, "rz", B * 2 * n)
        check_float(c, "c", B * n)
        dv = torch.empty(B, 3 * n, dtype=torch.float32)
        self._gru_backward_out(B, n, d.data_ptr(), optional_float(mask, "mask", B * n), rz.data_ptr(), c.data_ptr(), h.data_ptr(),
                               dv.data_ptr())
        return dv

    def gru_backward_reset(self, t: Tensor, h: Tensor, rz: Tensor, dv: Tensor, g_bias: Tensor) -> None:
        """The reset part of ``dv`` from ``t`` = (candidate part of dv)·Whᵀ: ``t·h·r(1 − r)``;
        then the column sums of ``dv`` (the bias gradient, 3n) into ``g_bias``."""
        B, n = check_matrix(h, "h")
        check_float(t, "t", B * n)
        check_float(rz, "rz", B * 2 * n)
        check_float(dv, "dv", B * 3 * n)
        check_float(g_bias, "g_bias", 3 * n)
        self._gru_backward_reset(B, n, t.data_ptr(), h.data_ptr(), rz.data_ptr(), dv.data_ptr(), g_bias.data_ptr())

    def dropout_masks(self, u: Tensor, split: int, p_first: float, p_rest: float) -> None:
        """The uniform draws ``u`` (flat) become inverted-dropout masks in place: 1/(1 − p) where
        u ≥ p, else 0, with p = ``p_first`` before position ``split`` and ``p_rest`` from there on
        (:func:`gru4rec.training.dropout.keep_masks` in one pass)."""
        n = u.numel()
        check_float(u, "u", n)
        if not 0 <= split <= n:
            raise ValueError(f"split must be between 0 and {n}, got {split}")
        # the factors as PyTorch's product with a Python float rounds them (a part that is empty
        # needs none: its p may be anything)
        keep_first = 1.0 / (1.0 - p_first) if split > 0 else 0.0
        keep_rest = 1.0 / (1.0 - p_rest) if split < n else 0.0
        self._dropout_masks(n, split, u.data_ptr(), p_first, keep_first, p_rest, keep_rest)

    def cross_entropy(self, x: Tensor, w: Tensor, logit_form: bool) -> Tensor:
        """Cross-entropy of each row's positive (column i of row i) under the softmax of the
        scores ``x`` (B×C, masked columns already at −1e30), rows weighted by ``w`` (B): returns
        the loss (0-dim) and overwrites ``x`` with dL/dx. ``logit_form``: −log p instead of
        −log(p + 1e-24)."""
        n_rows, n_cols = check_scores(x, "x")
        check_float(w, "w", n_rows)
        loss = torch.empty((), dtype=torch.float32)
        self._cross_entropy(n_rows, n_cols, x.data_ptr(), w.data_ptr(), int(logit_form), loss.data_ptr())
        return loss

    def bpr_max(self, r: Tensor, valid: Tensor, w: Tensor, bpreg: float, elu_alpha: float | None = None) -> tuple[Tensor, Tensor]:
        """BPR-max with score regularisation ``bpreg`` of the activated scores ``r`` (B×C), over
        each row's negatives (the other columns whose ``valid`` is 1), rows weighted by ``w``:
        the loss (0-dim) and dL/dr. With ``elu_alpha`` = A, ``r`` holds the raw scores x, is
        overwritten with elu-A(x) (the kernel's own exp, within a few ulps of torch's ELU), and
        the gradient returned is dL/dx."""
        n_rows, n_cols = check_scores(r, "r")
        check_float(valid, "valid", n_cols)
        check_float(w, "w", n_rows)
        grad = torch.empty_like(r)
        loss = torch.empty((), dtype=torch.float32)
        self._bpr_max(n_rows, n_cols, r.data_ptr(), valid.data_ptr(), w.data_ptr(), bpreg, int(elu_alpha is not None),
                      0.0 if elu_alpha is None else elu_alpha, grad.data_ptr(), loss.data_ptr())
        return loss, grad


_kernels: CpuKernels | None = None
_loaded = False


def cpu_kernels() -> CpuKernels | None:
    """The fused CPU kernels, built and loaded once per process; None when they are turned off
    (``GRU4REC_CPU_KERNELS=0``) or cannot be built here (then a warning says why, once)."""
    global _kernels, _loaded
    if not _loaded:
        _loaded = True
        if cpu_kernels_allowed():
            try:
                _kernels = load_kernels()
            except KernelBuildError as exc:
                warnings.warn(
                    f"gru4rec: the fused CPU kernels could not be built ({exc}); training on the CPU uses the PyTorch "
                    "path, which gives the same results more slowly. Set CC to a working C compiler, or "
                    "GRU4REC_CPU_KERNELS=0 to silence this.",
                    stacklevel=2,
                )
    return _kernels


def load_kernels(cache_dir: Path | None = None, compiler: str | None = None) -> CpuKernels:
    """Build ``cpu_kernels.c`` (unless the cache has this build) and load it. Raises
    :class:`KernelBuildError` saying why when it cannot."""
    target = build_library(cache_dir, compiler)
    try:
        return CpuKernels(ctypes.CDLL(str(target)), target)
    except (OSError, AttributeError) as exc:
        raise KernelBuildError(f"cannot load {target}: {exc}") from None
