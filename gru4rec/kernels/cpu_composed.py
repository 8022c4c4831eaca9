"""The fused composition of item rows from their attributes on the CPU (``cpu_kernels.c``'s
``g4r_compose_rows`` and ``g4r_code_grads``), bound to the tables of one
:class:`~gru4rec.items.rows.ComposedRows` by :meth:`gru4rec.kernels.cpu.CpuKernels.composition`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gru4rec.kernels.c_args import F32, I64, INT64, VOIDP, check_float_vector, check_index, check_matrix, optional_float

__all__ = ["ComposedTables"]


class ComposedTables:
    """The one-code attribute columns of :class:`gru4rec.items.rows.ComposedRows` — table c
    (n_codes_c × columns: the row's width, and its bias column where the rows have one) read at
    ``codes[c][item]`` — bound once to two kernels: :meth:`compose`, a step's composed rows and
    biases in one pass, and :meth:`grads`, the tables' gradients summed per distinct code in one
    pass. The codes, their scratch tables and the C argument arrays are made here once (a step
    pays for no ctypes object); the tables are read through their current storage on every call
    (an optimiser or huge pages may move it), their layout checked again."""

    def __init__(self, compose_fn: Callable[..., None], grads_fn: Callable[..., None], tables: list[Tensor],
                 codes: list[Tensor]) -> None:
        if len(tables) != len(codes):
            raise ValueError(f"need one codes table per table, got {len(tables)} tables and {len(codes)} codes tables")
        self._compose_fn, self._grads_fn = compose_fn, grads_fn
        self.tables = tables
        self._shapes = [check_matrix(t, f"tables[{c}]") for c, t in enumerate(tables)]
        widths = {w for _, w in self._shapes}
        if len(widths) > 1:
            raise ValueError(f"the tables must have one number of columns, got {sorted(widths)}")
        #: The tables' columns (the composed rows' width, plus one with a bias column).
        self.columns = widths.pop() if widths else 0
        self.codes = codes
        self.n_items = min((cc.numel() for cc in codes), default=0)
        for c, (cc, (n_codes, _)) in enumerate(zip(codes, self._shapes, strict=True)):
            check_index(cc, f"codes[{c}]", n_codes)
            if cc.numel() and not 0 <= int(cc.min()) <= int(cc.max()) < n_codes:  # once, so that no call reads astray
                raise ValueError(f"codes[{c}] must lie in [0, {n_codes}) (its table's rows)")
        n = max(1, len(tables))
        self._marks = [torch.zeros(n_codes, dtype=torch.uint8) for n_codes, _ in self._shapes]
        self._slots = [torch.zeros(n_codes, dtype=I64) for n_codes, _ in self._shapes]
        self._table_ptrs = (VOIDP * n)()
        self._code_ptrs = (VOIDP * n)(*(cc.data_ptr() for cc in codes))
        self._n_codes = (INT64 * n)(*(n_codes for n_codes, _ in self._shapes))
        self._mark_ptrs = (VOIDP * n)(*(m.data_ptr() for m in self._marks))
        self._slot_ptrs = (VOIDP * n)(*(s.data_ptr() for s in self._slots))
        self._uniq_ptrs, self._out_ptrs, self._n_uniq = (VOIDP * n)(), (VOIDP * n)(), (INT64 * n)()

    def _bind_tables(self) -> None:
        for c, (t, shape) in enumerate(zip(self.tables, self._shapes, strict=True)):
            if t.dtype is not F32 or not t.is_cpu or not t.is_contiguous() or tuple(t.shape) != shape:
                raise ValueError(f"tables[{c}] must stay a contiguous float32 CPU tensor of shape {shape}, got "
                                 f"{t.dtype} {tuple(t.shape)} on {t.device}")
            self._table_ptrs[c] = t.data_ptr()

    def _width(self, width: int, name: str) -> None:
        if self.tables and self.columns not in (width, width + 1):
            raise ValueError(f"{name} has {width} columns; the tables' {self.columns} must be {width} or {width + 1}")

    def compose(self, id_table: Tensor, items: Tensor, *, id_bias: Tensor | None = None, keep: Tensor | None = None,
                unknown_bias: float = 0.0) -> tuple[Tensor, Tensor | None]:
        """The composed rows (n × width) of the warm ``items`` (below ``id_table``'s rows) —
        ``id_table[items]``, zeros where ``keep`` (bool, n) is False, plus each table's row
        ``[codes[c][items], :width]`` in order — and with ``id_bias`` their biases (n:
        ``id_bias[items]``, ``unknown_bias`` where dropped, plus each table's column ``width``
        where the tables have one), else None."""
        n_warm, width = check_matrix(id_table, "id_table")
        n = check_index(items, "items", n_warm)
        self._width(width, "id_table")
        if self.tables and n_warm > self.n_items:
            raise ValueError(f"id_table has {n_warm} rows, the codes cover {self.n_items} items")
        if keep is not None and (keep.dtype is not torch.bool or not keep.is_cpu or not keep.is_contiguous() or keep.numel() != n):
            raise ValueError(f"keep must be a contiguous bool CPU tensor of {n} elements")
        self._bind_tables()
        out = torch.empty(n, width, dtype=F32)
        out_bias = None if id_bias is None else torch.empty(n, dtype=F32)
        self._compose_fn(n, items.data_ptr(), width, id_table.data_ptr(), optional_float(id_bias, "id_bias", n_warm),
                         None if keep is None else keep.data_ptr(), unknown_bias, len(self.tables), self._table_ptrs,
                         self._code_ptrs, self.columns, out.data_ptr(), None if out_bias is None else out_bias.data_ptr())
        return out, out_bias

    def grads(self, items: Tensor, g_rows: Tensor, g_bias: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
        """Each table's gradient from the composed rows' (``g_rows``, n × width, of the
        ``items``; ``g_bias``: of the first ``len(g_bias)`` items' biases, the others' 0): its
        distinct codes ``codes[c][items]`` (ascending) and each one's gradient row (the tables'
        columns: the bias column's from ``g_bias``), summed in item order; one pass over
        ``g_rows`` for all tables."""
        n_rows, width = check_matrix(g_rows, "g_rows")
        n = check_index(items, "items", self.n_items)
        self._width(width, "g_rows")
        n_bias = 0 if g_bias is None else check_float_vector(g_bias, "g_bias")
        if n_rows != n or n_bias > n:
            raise ValueError(f"g_rows must have a row per item ({n}) and g_bias at most as many, got {n_rows} and {n_bias}")
        # at most one row per code, and per item
        uniq = [torch.empty(min(n, n_codes), dtype=I64) for n_codes, _ in self._shapes]
        out = [torch.empty(min(n, n_codes), self.columns, dtype=F32) for n_codes, _ in self._shapes]
        for c, (u, o) in enumerate(zip(uniq, out, strict=True)):
            self._uniq_ptrs[c], self._out_ptrs[c] = u.data_ptr(), o.data_ptr()
        self._grads_fn(n, items.data_ptr(), len(self.tables), self._code_ptrs, self._n_codes, self._mark_ptrs, self._slot_ptrs,
                       width, g_rows.data_ptr(), n_bias, None if g_bias is None else g_bias.data_ptr(), self.columns,
                       self._uniq_ptrs, self._out_ptrs, self._n_uniq)
        return [(u[:m], o[:m]) for u, o, m in zip(uniq, out, self._n_uniq[: len(self.tables)], strict=True)]
