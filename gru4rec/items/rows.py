"""Composed item rows: an item's row is its id row plus the sum of its attributes' embeddings.

For one item table of width d (the output table ``Wy``) a :class:`ComposedRows` holds the
attribute side of the composition, built from an :class:`~gru4rec.items.attributes.ItemAttributes`:

    row(i) = id(i) + Σ_c pool_c(i) + numeric(i)·P

With ``bias=True`` every attribute table and the projection carry one more column, whose part
adds to the item's **bias** (``By``) as the other d add to its row: ``bias(i) = By(i) + Σ_c
pool_c(i)[d] + numeric(i)·P[:, d]``. A cold item thus gets the bias its attributes earned — the
popularity of its brand, its category — on top of the average item's id bias
(:func:`unknown_id_bias`, as it has no ``By`` of its own), and a row and a bias are always
composed, and differentiated, in one pass over the same gathered codes.

* ``id(i)`` is row i of the id table (owned by the network, passed in); a **cold item**
  (i ≥ ``n_warm``, no training event) has no id row: its id part is a row of zeros, so it is
  scored from its attributes alone. A training step may also **drop** the id part of warm items
  (``keep``: a boolean per item of the batch, :meth:`gru4rec.training.dropout.DropoutMasks.keep_ids`):
  a dropped item is composed as a cold one, and its id row and bias get no gradient;
* per categorical column c an embedding table ``T_c`` of ``n_codes`` rows (row 0: the unknown
  value); a ``categorical`` column adds ``T_c[code]``, a ``multi`` column the **mean** of its
  values' rows (``pool_c``). Mean rather than sum: the part keeps the scale of one row however
  many values an item lists, so an item with ten tags does not get a row (and a dot-product
  score) ten times larger than one with a single tag — the number of tags is not evidence of
  relevance — and the unknown value (one code 0) stays on the scale of any other;
* the standardised numerics (``n_numeric`` per item) through a learned projection
  ``P`` (n_numeric × d).

Everything is vectorised: a categorical column is one gather, a multi column a padded gather of
its flat codes (width: the column's longest list, fixed at construction so no shape depends on
the data: no host sync in the forward) summed over the padding axis with weights ``1/len`` — its
temporaries are B × longest list × d, so a column where a few items list very many values costs
as if every item did.
:meth:`ComposedRows.compose` builds the rows of a batch of item indices (duplicates allowed),
:meth:`ComposedRows.compose_all` every item's row in chunks whose temporaries fit a memory
budget. :meth:`ComposedRows.backward` turns dL/d(row) of a batch into the gradients of the id
rows and of every attribute table as (unique row indices, summed gradient rows) — the form the
optimiser's lazy row updates take (:class:`gru4rec.training.optim.UniqueGrad`) — and the dense
gradient of the projection. Making rows unique needs their number, i.e. a host sync on a GPU,
like the optimiser's own unique-row path.

Without any attribute column the composition is the id rows themselves, bit for bit.
:class:`~gru4rec.network.gru.GRU4RecNet` composes its ``Wy`` rows and biases with one (and, in
the separate and one-hot modes, layer 0's input rows with a second, without bias), trained by
FastStep on the CPU and the reference step elsewhere (:mod:`gru4rec.training.composed`;
docs/attributes.md, "Training with attributes") and written whole by the model file
(:mod:`gru4rec.formats.model_file`, from :attr:`ComposedRows.source`).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from gru4rec.items.attributes import ItemAttributes
from gru4rec.kernels.cpu import CpuKernels
from gru4rec.kernels.cpu_composed import ComposedTables

__all__ = ["DEFAULT_BUDGET_BYTES", "ComposedCatalogue", "ComposedRows", "RowGrad", "RowGrads", "unknown_id_bias"]

#: Default bound on the temporaries of :meth:`ComposedRows.compose_all` (bytes).
DEFAULT_BUDGET_BYTES = 256 * 2**20


def unknown_id_bias(id_bias: Tensor) -> Tensor:
    """The id bias of an item without one — a cold item, or one a training step's id dropout
    drops: the **mean** of the training items' id biases (0-dim, no gradient). The unknown id
    effect is estimated by the average one: 0 instead would favour every new item by minus that
    mean — after training By's mean is well below 0 (the biases absorb the sampled softmax's
    normaliser), and on the intents-attributes benchmark (2026-12-06, docs/attributes.md) the
    zero made the model rank cold items above the optimum's own MRR@20 (0.049 against 0.037) at
    the warm targets' expense (warm Recall@20 0.271; with the mean 0.289)."""
    return id_bias.detach().mean()


class RowGrad(NamedTuple):
    """Gradient rows of a table at unique row indices (same fields as the optimiser's ``UniqueGrad``)."""

    rows: Tensor
    grad: Tensor


@dataclass(frozen=True)
class RowGrads:
    """The gradients of one batch's composition.

    ``id``: of the id table at the batch's distinct warm (and kept) items; ``id_bias``: of the id
    biases (``By``) at the same rows (None unless the composition has a bias column and was given
    the bias gradient); ``tables``: of each attribute table by its name in
    :meth:`ComposedRows.sparse_parameters` at its distinct codes (summed over the items that share
    them); ``projection``: of ``P`` (n_numeric × columns), or None without numerics."""

    id: RowGrad
    tables: dict[str, RowGrad]
    projection: Tensor | None
    id_bias: Tensor | None = None


class _Column(NamedTuple):
    """A categorical column on the device: flat codes, offsets [n + 1], padded width (0: no codes)."""

    codes: Tensor
    offsets: Tensor
    width: int
    multi: bool


def _unique_sum(index: Tensor, values: Tensor) -> RowGrad:
    """The distinct indices (ascending) and the sum of ``values`` rows at each."""
    uniq, inverse = torch.unique(index, sorted=True, return_inverse=True)
    total = values.new_zeros((uniq.shape[0], *values.shape[1:]))
    return RowGrad(uniq, total.index_add_(0, inverse, values))


class ComposedRows(nn.Module):
    """The attribute side of one item table of width ``width`` (see the module docstring).

    Parameters: ``tables[c]`` (n_codes_c × columns) per categorical column of
    ``attributes.encoding`` in its order, ``projection`` (n_numeric × columns, None without
    numeric columns); columns = ``width``, plus one with ``bias`` (the bias column). Buffers:
    the attributes' codes, offsets and numbers on ``device`` in ``dtype``. ``n_warm`` items have
    id rows; items ``n_warm..n_items-1`` are cold.
    Initialise with :meth:`reset_parameters` (the constructor draws with the default rule).
    """

    def __init__(self, attributes: ItemAttributes, width: int, *, bias: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"ComposedRows: width={width!r} is invalid; need an int >= 1")
        if attributes.n_warm < 1:  # as GRU4RecNet: a model has at least one item with an id row
            raise ValueError("ComposedRows: the attributes have no training item (n_warm=0)")
        self.width = width
        #: Whether the tables and the projection carry a bias column (their last).
        self.bias = bias
        #: The tables' and the projection's columns: the row's ``width``, then the bias column.
        self.columns = width + int(bias)
        #: The encoded attributes these rows were built from: the model file writes them (with
        #: their encoding) so that a loaded model composes the same rows and encodes new items alike.
        self.source = attributes
        self.n_warm = attributes.n_warm
        self.n_items = attributes.n_items
        #: The ids of the items, warm then cold (the catalogue a model with these rows ranks).
        self.item_map = attributes.item_map
        #: The categorical columns' names, in the order of ``tables`` (``cat{c}``).
        self.names = [enc.name for enc in attributes.encoding.categorical]
        #: Per categorical column: its padded width (the longest list; 0 when no item has a code) and kind.
        self._shape: list[tuple[int, bool]] = []
        #: The one-code columns bound to the fused CPU kernels (:meth:`_fused`), made on first use.
        self._bound: tuple[CpuKernels, ComposedTables] | None = None
        tables = []
        for c, enc in enumerate(attributes.encoding.categorical):
            offsets = attributes.offsets[c]
            lengths = offsets[1:] - offsets[:-1]
            self._shape.append((int(lengths.max()) if len(lengths) else 0, enc.multi))
            # Buffers, so that .to(device) moves them with the tables.
            self.register_buffer(f"cat{c}_codes", torch.as_tensor(attributes.codes[c], dtype=torch.int64, device=device))
            self.register_buffer(f"cat{c}_offsets", torch.as_tensor(offsets, dtype=torch.int64, device=device))
            tables.append(nn.Parameter(torch.empty(enc.n_codes, self.columns, device=device, dtype=dtype)))
        self.tables = nn.ParameterList(tables)
        #: The categorical columns with one code per item (and some code): the fused kernels' part.
        self._one_code = [c for c, (w, multi) in enumerate(self._shape) if w > 0 and not multi]
        #: Whether a multi column has codes (its part is PyTorch's also where the kernels compose).
        self._multi = any(w > 0 and multi for w, multi in self._shape)
        n_numeric = len(attributes.encoding.numeric)
        self.projection: nn.Parameter | None = (
            nn.Parameter(torch.empty(n_numeric, self.columns, device=device, dtype=dtype)) if n_numeric else None)
        self.register_buffer("numeric", torch.as_tensor(attributes.numeric, device=device).to(dtype))
        self.numeric: Tensor
        self.reset_parameters(generator=generator)

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def reset_parameters(self, sigma: float = 0.0, normal: bool = False, generator: torch.Generator | None = None,
                         n_rows: int | None = None) -> None:
        """Draw every table and the projection as GRU4RecNet draws its item tables
        (:meth:`~gru4rec.network.gru.GRU4RecNet.reset_parameters`): U[−σ, σ], or N(0, σ²) when
        ``normal``, with ``sigma`` when > 0 and otherwise σ = sqrt(6/(n_rows + width)) — the σ
        of **the item table the rows are added to** (``n_rows``: its rows, default ``n_warm``),
        not of each small table: a 20-row table would get a σ several times the id rows' and
        swamp them, while with one σ every part of the sum starts on the id row's scale. Drawn
        in order: the tables by column, then the projection, each with ``generator``. The bias
        column is zero, as ``By`` starts."""
        rows = self.n_warm if n_rows is None else n_rows
        s = sigma if sigma > 0 else math.sqrt(6.0 / (rows + self.width))
        blocks = [*self.tables] + ([self.projection] if self.projection is not None else [])
        for block in blocks:
            values = torch.empty(block.shape, dtype=block.dtype)  # drawn on the CPU: the same numbers on any device
            if normal:
                values.normal_(0.0, s, generator=generator)
            else:
                values.uniform_(-s, s, generator=generator)
            block.copy_(values)
            if self.bias:
                block[:, self.width].zero_()

    def with_attributes(self, attributes: ItemAttributes) -> ComposedRows:
        """New rows over ``attributes`` (these attributes plus new cold items:
        :meth:`ItemAttributes.add_items`) that share this module's tables and projection, so
        that every existing item keeps its row bit for bit and the new items are composed with
        the trained weights. ValueError when the warm items or the encoding differ."""
        if attributes.n_warm != self.n_warm or attributes.encoding is not self.source.encoding:
            raise ValueError("ComposedRows.with_attributes: the attributes must extend these rows' own "
                             "(same training items, same encoding)")
        first = self.tables[0] if len(self.tables) else self.projection
        device = None if first is None else first.device
        dtype = self.numeric.dtype
        rows = ComposedRows(attributes, self.width, bias=self.bias, device=device, dtype=dtype, generator=torch.Generator())
        with torch.no_grad():
            for new, old in zip(rows.tables, self.tables, strict=True):
                new.copy_(old)
            if rows.projection is not None and self.projection is not None:
                rows.projection.copy_(self.projection)
        return rows

    # ------------------------------------------------------------------ structure

    @property
    def _columns(self) -> list[_Column]:
        return [_Column(getattr(self, f"cat{c}_codes"), getattr(self, f"cat{c}_offsets"), w, multi)
                for c, (w, multi) in enumerate(self._shape)]

    def sparse_parameters(self, prefix: str = "") -> dict[str, nn.Parameter]:
        """The attribute tables by name (``{prefix}cat{c}``), updated at the rows a step uses."""
        return {f"{prefix}cat{c}": t for c, t in enumerate(self.tables)}

    def dense_parameters(self, prefix: str = "") -> dict[str, nn.Parameter]:
        """The projection (``{prefix}numeric``), used by every step: a dense parameter."""
        return {} if self.projection is None else {f"{prefix}numeric": self.projection}

    @property
    def has_attributes(self) -> bool:
        """Whether any column adds to the id rows."""
        return bool(self._shape) or self.projection is not None

    def bytes_per_item(self) -> int:
        """An upper estimate of the temporaries of composing one item's row, in bytes: its
        gathered and weighted rows (every multi column padded to its longest list), the id row,
        the partial sums, and the int64 positions, codes and weights of the padding."""
        elem = self.numeric.element_size()
        padded = sum(w for w, _ in self._shape)
        return elem * self.columns * (4 + 2 * padded) + (16 + elem) * padded

    # ------------------------------------------------------------------ the forward

    def _gather(self, col: _Column, items: Tensor) -> tuple[Tensor, Tensor | None]:
        """The codes of ``items`` (B, or B × width for a multi column) and their weights
        (None: one code each, weight 1; else 1/len at valid positions, 0 at the padding)."""
        if not col.multi:
            return col.codes.index_select(0, items), None
        start = col.offsets.index_select(0, items)
        length = col.offsets.index_select(0, items + 1) - start
        j = torch.arange(col.width, device=items.device)
        # Padding positions read the item's last code (any valid index would do: their weight is 0).
        last = (start + length - 1).clamp_(min=0, max=col.codes.shape[0] - 1)
        pos = torch.minimum(start[:, None] + j, last[:, None])
        valid = j < length[:, None]
        weight = valid.to(self.numeric.dtype) / length.clamp(min=1).to(self.numeric.dtype)[:, None]
        return col.codes[pos], weight

    def _parts(self, items: Tensor, *, multi_only: bool = False) -> Iterator[Tensor]:
        """Each column's part of the items (B × columns; columns without codes skipped, and with
        ``multi_only`` the one-code columns too), then the numerics'."""
        for col, table in zip(self._columns, self.tables, strict=True):
            if col.width == 0 or (multi_only and not col.multi):  # no item has a code, or the kernels' column
                continue
            codes, weight = self._gather(col, items)
            yield table.index_select(0, codes) if weight is None else (table[codes] * weight[:, :, None]).sum(1)
        if self.projection is not None:
            yield self.numeric.index_select(0, items) @ self.projection

    def attribute_part(self, items: Tensor) -> Tensor | None:
        """Σ_c pool_c(i) + numeric(i)·P for the items (B × columns: the row's part, then with
        ``bias`` the bias's), None without attributes."""
        part: Tensor | None = None
        for rows in self._parts(items):
            part = rows if part is None else part + rows
        return part

    def __getstate__(self) -> dict[str, object]:
        """The module's state for pickling and deep copies, without the kernels' binding (its C
        argument arrays hold addresses: a copy binds its own on first use)."""
        state = self.__dict__.copy()
        state["_bound"] = None
        return state

    def _fused(self, kernels: CpuKernels) -> ComposedTables:
        """The one-code columns (:attr:`_one_code`: their tables and per-item codes) bound to
        ``kernels``, made once (again only for other kernels)."""
        if self._bound is None or self._bound[0] is not kernels:
            bound = kernels.composition([self.tables[c] for c in self._one_code],
                                        [getattr(self, f"cat{c}_codes") for c in self._one_code])
            self._bound = (kernels, bound)
        return self._bound[1]

    @torch.no_grad()
    def compose_warm(self, id_table: Tensor, items: Tensor, keep: Tensor | None = None,
                     id_bias: Tensor | None = None, kernels: CpuKernels | None = None) -> tuple[Tensor, Tensor | None]:
        """:meth:`compose` (and with ``id_bias`` :meth:`compose_scored`'s biases; else None) of
        warm items only — a training step's: inputs, targets and samples are training items —,
        not differentiable: the id rows gathered (zeroed where ``keep`` is False), each part added
        in place. No cold-item mask (a cold index is out of the id table's range: an IndexError),
        no temporaries beyond one part: half :meth:`compose`'s time in a training step. The sum's
        order differs from :meth:`compose`'s: equal up to rounding. With the fused CPU ``kernels``
        (float32 CPU tables) the id rows and the one-code columns' parts are one pass
        (:meth:`ComposedTables.compose`: a step's ~1,500 rows took a third of the attribute
        step's extra time as a gather and two strided adds per part), the same sums in the
        same order, bit for bit; the multi columns' and the numerics' parts follow as below."""
        if kernels is not None:  # the id rows and the one-code columns in one pass, then the other parts
            unknown = 0.0 if keep is None or id_bias is None else float(unknown_id_bias(id_bias))
            rows, bias = self._fused(kernels).compose(id_table, items, keep=keep, unknown_bias=unknown, id_bias=id_bias)
            parts = self._parts(items, multi_only=True)
        else:
            rows = id_table.index_select(0, items)
            bias = None if id_bias is None else id_bias.index_select(0, items)
            if keep is not None:
                drop = ~keep
                rows.masked_fill_(drop[:, None], 0.0)
                if bias is not None and id_bias is not None:
                    bias.masked_fill_(drop, unknown_id_bias(id_bias))
            parts = self._parts(items)
        for part in parts:
            rows.add_(part[:, : self.width])
            if bias is not None and self.bias:
                bias.add_(part[:, self.width])
        return rows, bias

    def _has_id(self, items: Tensor, keep: Tensor | None) -> Tensor:
        """Which items take their id part: the warm ones, and of those the kept ones (B, bool)."""
        warm = items < self.n_warm
        return warm if keep is None else warm & keep

    def id_rows(self, id_table: Tensor, items: Tensor, keep: Tensor | None = None) -> Tensor:
        """The id rows of the items, a row of zeros for a cold item (no id row) and for a
        dropped one (``keep`` False)."""
        if id_table.dim() != 2 or id_table.shape[0] != self.n_warm or id_table.shape[1] != self.width:
            raise ValueError(f"ComposedRows: the id table is {tuple(id_table.shape)}, expected "
                             f"({self.n_warm}, {self.width}): one row per warm item")
        rows = id_table.index_select(0, items.clamp(max=self.n_warm - 1))
        return torch.where(self._has_id(items, keep)[:, None], rows, 0.0)

    def compose(self, id_table: Tensor, items: Tensor, keep: Tensor | None = None) -> Tensor:
        """The composed rows (B × width) of the item indices ``items`` (int64, B; duplicates
        allowed; 0 <= i < n_items), the id part dropped where ``keep`` is False. Differentiable:
        autograd reaches the id table, the attribute tables and the projection (the reference
        :meth:`backward` is tested against)."""
        rows = self.id_rows(id_table, items, keep)
        part = self.attribute_part(items)
        return rows if part is None else rows + part[:, : self.width]

    def compose_scored(self, id_table: Tensor, id_bias: Tensor, items: Tensor,
                       keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The composed rows (B × width) and biases (B) of ``items``: with ``bias``, the id
        bias (``By``, N; :func:`unknown_id_bias` for a cold or dropped item) plus the bias
        column's part; without it the id bias alone. One gather of the codes for both.
        Differentiable like :meth:`compose` (the unknown items' id bias is a constant)."""
        has_id = self._has_id(items, keep)
        rows = self.id_rows(id_table, items, keep)
        b = torch.where(has_id, id_bias.index_select(0, items.clamp(max=self.n_warm - 1)), unknown_id_bias(id_bias))
        part = self.attribute_part(items)
        if part is None:
            return rows, b
        rows = rows + part[:, : self.width]
        return rows, (b + part[:, self.width] if self.bias else b)

    def chunk_bounds(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> list[tuple[int, int]]:
        """Item ranges [start, stop) covering every item whose composition's temporaries fit
        ``budget_bytes`` (at least one item per chunk)."""
        if budget_bytes < 1:
            raise ValueError(f"ComposedRows: budget_bytes={budget_bytes!r} is invalid; need >= 1")
        step = max(1, budget_bytes // self.bytes_per_item())
        return [(a, min(a + step, self.n_items)) for a in range(0, self.n_items, step)]

    def compose_all(self, id_table: Tensor, id_bias: Tensor, *, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                    out: Tensor | None = None, out_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Every item's composed row and bias (n_items × width and n_items: the warm items, then
        the cold ones; :meth:`compose_scored`), chunk by chunk (:meth:`chunk_bounds`) into ``out``
        and ``out_bias`` if given: the catalogue for scoring. The budget bounds the temporaries,
        not the result. Not differentiable."""
        if out is None:
            out = id_table.new_empty((self.n_items, self.width))
        elif out.shape != (self.n_items, self.width):
            raise ValueError(f"ComposedRows: out is {tuple(out.shape)}, expected ({self.n_items}, {self.width})")
        if out_bias is None:
            out_bias = id_table.new_empty(self.n_items)
        elif out_bias.shape != (self.n_items,):
            raise ValueError(f"ComposedRows: out_bias is {tuple(out_bias.shape)}, expected ({self.n_items},)")
        with torch.no_grad():
            for a, b in self.chunk_bounds(budget_bytes):
                out[a:b], out_bias[a:b] = self.compose_scored(id_table, id_bias, torch.arange(a, b, device=id_table.device))
        return out, out_bias

    def compose_all_rows(self, id_table: Tensor, *, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                         out: Tensor | None = None) -> Tensor:
        """Every item's composed row (n_items × width, warm then cold; :meth:`compose`) without a
        bias — the catalogue of a table whose rows have none (layer 0's input rows in the
        separate and one-hot modes) —, chunk by chunk as :meth:`compose_all`, into ``out`` if
        given. Not differentiable."""
        if out is None:
            out = id_table.new_empty((self.n_items, self.width))
        elif out.shape != (self.n_items, self.width):
            raise ValueError(f"ComposedRows: out is {tuple(out.shape)}, expected ({self.n_items}, {self.width})")
        with torch.no_grad():
            for a, b in self.chunk_bounds(budget_bytes):
                out[a:b] = self.compose(id_table, torch.arange(a, b, device=id_table.device))
        return out

    # ------------------------------------------------------------------ the backward

    @torch.no_grad()
    def backward(self, items: Tensor, grad_rows: Tensor, grad_bias: Tensor | None = None,
                 keep: Tensor | None = None) -> RowGrads:
        """The gradients of the composition of ``items`` (B, duplicates allowed) given
        ``grad_rows`` = dL/d(row) (B × width) and, for :meth:`compose_scored`, ``grad_bias`` =
        dL/d(bias) (B): each table's as unique rows with the gradients of every position that
        reads them summed (a repeated item, or a code shared by several items or listed twice by
        one), the projection's as a dense matrix. A cold item, or one dropped by ``keep``, gives
        no id row (and id bias) gradient. Syncs with the host on a GPU (the number of unique rows)."""
        full = self._part_grads(grad_rows, grad_bias, bias=grad_bias is not None)  # [rows | bias]: one pass sums both
        has_id = self._has_id(items, keep)
        if bool(has_id.all()):
            ids = _unique_sum(items, full)
        else:
            ids = _unique_sum(items[has_id], full[has_id])
        id_bias = None if grad_bias is None else ids.grad[:, self.width]
        ids = RowGrad(ids.rows, ids.grad[:, : self.width])
        parts = self.table_grads(items, grad_rows, grad_bias)
        empty = RowGrad(items.new_zeros(0), grad_rows.new_zeros((0, self.columns)))
        tables = {name: _unique_sum(*parts[name]) if name in parts else empty for name in self.sparse_parameters()}
        return RowGrads(ids, tables, self.projection_grad(items, grad_rows, grad_bias), id_bias)

    def _part_grads(self, grad_rows: Tensor, grad_bias: Tensor | None, *, bias: bool = False) -> Tensor:
        """dL/d of the items' parts (B × columns) from dL/d(row) ``grad_rows`` (B × width) and
        dL/d(bias) ``grad_bias`` of the first ``len(grad_bias)`` items (the others': 0; None: all
        0): ``[rows | bias]`` with ``bias`` (the tables' bias column; ``bias`` True: whether or not
        the tables have one, as :meth:`backward` sums the id biases with the rows), else the rows."""
        if not (self.bias or bias):
            return grad_rows
        g = torch.cat((grad_rows, grad_rows.new_zeros((grad_rows.shape[0], 1))), 1)
        if grad_bias is not None:
            g[: grad_bias.shape[0], self.width] = grad_bias
        return g

    @torch.no_grad()
    def table_grads(self, items: Tensor, grad_rows: Tensor, grad_bias: Tensor | None = None, *,
                    kernels: CpuKernels | None = None) -> dict[str, tuple[Tensor, Tensor]]:
        """Each attribute table's gradient as (codes, gradient rows) from ``grad_rows`` = dL/d(the
        items' rows) (B × width) and ``grad_bias`` = dL/d(their biases) of the first
        ``len(grad_bias)`` items (the others', and all with None: 0; the tables' bias column's
        gradient, with ``bias``). **One row per code read** — a code shared by several items, or
        read by a repeated item, comes as often as it is read (the optimiser's row rules, or
        :meth:`backward`, sum them): a categorical column's rows are ``[grad_rows | grad_bias]``
        itself, a multi column's weighted copies at its valid positions (a boolean selection: a
        host sync on a GPU). With the fused CPU ``kernels`` a categorical column's rows come
        summed per distinct code instead (:meth:`ComposedTables.grads`: one pass, no B ×
        columns copy; the optimiser's sum of them is then the same, bit for bit). A column no
        item has a code in is left out."""
        out: dict[str, tuple[Tensor, Tensor]] = {}
        summed: list[int] = []  # the columns the kernels sum
        if kernels is not None and self._one_code:
            summed = self._one_code
            g_bias = grad_bias.contiguous() if self.bias and grad_bias is not None else None
            got = self._fused(kernels).grads(items, grad_rows.contiguous(), g_bias)
            out.update((f"cat{c}", RowGrad(*g)) for c, g in zip(summed, got, strict=True))
            if not self._multi:
                return out
        full: Tensor | None = None  # [rows | bias], built once if a column needs it
        for c, col in enumerate(self._columns):
            if col.width == 0 or c in summed:
                continue
            if full is None:
                full = self._part_grads(grad_rows, grad_bias)
            codes, weight = self._gather(col, items)
            if weight is None:
                out[f"cat{c}"] = (codes, full)
                continue
            valid = weight > 0
            owner = torch.arange(items.shape[0], device=items.device)[:, None].expand_as(codes)[valid]
            out[f"cat{c}"] = (codes[valid], full.index_select(0, owner) * weight[valid][:, None])
        return out

    @torch.no_grad()
    def projection_grad(self, items: Tensor, grad_rows: Tensor, grad_bias: Tensor | None = None) -> Tensor | None:
        """The projection's dense gradient (n_numeric × columns) from dL/d(the items' rows)
        ``grad_rows`` (B × width) and ``grad_bias`` (as :meth:`table_grads`), None without
        numeric columns. Two products (rows, bias column), not one over ``[rows | bias]``: that
        copy cost as much as the products."""
        if self.projection is None:
            return None
        x = self.numeric.index_select(0, items)
        if not self.bias:
            return x.t() @ grad_rows
        out = grad_rows.new_empty((x.shape[1], self.columns))
        out[:, : self.width] = x.t() @ grad_rows
        if grad_bias is None:
            out[:, self.width] = 0.0
        else:
            out[:, self.width] = x[: grad_bias.shape[0]].t() @ grad_bias
        return out


class ComposedCatalogue:
    """Every item's rows composed by one :class:`ComposedRows` over an id table (and, given id
    biases, the biases: :meth:`ComposedRows.compose_all`), kept in buffers between calls and
    composed again only when something they depend on changed: the rows object, the in-place
    versions of the id table, the id biases and every attribute parameter (torch bumps them on
    each in-place operation) — or a write torch does not see, said by :meth:`forget`. An
    evaluation's or a server's steps score against, and read input rows from, the same
    catalogue: composing it anew cost more than half of a step's scoring (43,000 items: 39 ms of
    121 ms on one thread)."""

    def __init__(self) -> None:
        #: The composed rows (n_items × width) and biases (n_items; None: composed without), or None before a call.
        self.rows: Tensor | None = None
        self.bias: Tensor | None = None
        self._key: tuple[int, ...] | None = None

    def forget(self) -> None:
        """The tables changed by a path torch does not count (the optimiser's fused CPU rules
        write through data pointers): the next call composes again."""
        self._key = None

    @torch.no_grad()
    def of(self, composition: ComposedRows, id_table: Tensor, id_bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The composed rows and, with ``id_bias``, biases of every item of ``composition``."""
        key = (id(composition), id_table._version, -1 if id_bias is None else id_bias._version,
               *(t._version for t in composition.parameters()))
        shape = (composition.n_items, composition.width)
        if self.rows is None or self.rows.shape != shape or self.rows.device != id_table.device \
                or self.rows.dtype != id_table.dtype or (self.bias is None) != (id_bias is None):
            self.rows = id_table.new_empty(shape)
            self.bias = None if id_bias is None else id_table.new_empty(shape[0])
        elif key == self._key:
            return self.rows, self.bias
        if id_bias is None:
            composition.compose_all_rows(id_table, out=self.rows)
        else:
            composition.compose_all(id_table, id_bias, out=self.rows, out_bias=self.bias)
        self._key = key
        return self.rows, self.bias
