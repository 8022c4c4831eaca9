"""The composed item rows (gru4rec.items.rows): an item's row is its id row plus its attributes'
embeddings. The forward against a NumPy reference written item by item from the docs; the
backward against torch autograd on the same composition and against finite differences; the
chunked catalogue against the batch; plain GRU4Rec (no attribute column) untouched, bit for bit."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.items.rows import ComposedRows, RowGrads
from gru4rec.training.optim import Optimizer, UniqueGrad

# ---------------------------------------------------------------------- data

# Training items 10..17 (item 17 has no row: unknown codes, numbers 0); ids 90, 91, 92 are cold.
_TRAIN = [10, 11, 12, 13, 14, 15, 16, 17]
_FRAME = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 14, 15, 16, 90, 91, 92],
    "category": ["x", "y", "x", "z", "y", "x", "w", "y", "q", "x"],  # "q": only a cold item has it -> unknown
    "tags": ["a|b", "b", "a|a|c", "c", "b|c|a|d", "d", "a", "a|b", "e", "c|d"],
    "price": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.5, 3.0, np.nan, 9.0],
    "weight": [0.5, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
})
_TYPES = {"category": "categorical", "tags": "multi", "price": "numeric", "weight": "numeric"}


def attributes(columns: list[str]) -> ItemAttributes:
    """The test items with the attribute ``columns`` (none: a table of ids only)."""
    table = item_table_from_frame(_FRAME[["ItemId", *columns]], types={c: _TYPES[c] for c in columns})
    return ItemAttributes.build(table, ItemMap.from_ids(pd.Series(_TRAIN)))


def reference_rows(attrs: ItemAttributes, id_table: np.ndarray, tables: list[np.ndarray],
                   projection: np.ndarray | None, items: list[int]) -> np.ndarray:
    """Each item's row written out one item at a time: id row (zeros for a cold item) + per
    categorical column the row of its code, or the mean of its codes' rows for a multi column,
    + its numbers times the projection."""
    out = []
    for i in items:
        row = id_table[i].copy() if i < attrs.n_warm else np.zeros(id_table.shape[1])
        for c, enc in enumerate(attrs.encoding.categorical):
            codes = attrs.codes[c][attrs.offsets[c][i]:attrs.offsets[c][i + 1]]
            if enc.multi:
                row = row + sum(tables[c][k] for k in codes) / len(codes)
            else:
                assert len(codes) == 1
                row = row + tables[c][codes[0]]
        if projection is not None:
            for j in range(projection.shape[0]):
                row = row + float(attrs.numeric[i, j]) * projection[j]
        out.append(row)
    return np.stack(out)


def setup(columns: list[str], width: int = 5, dtype: torch.dtype = torch.float64, seed: int = 0
          ) -> tuple[ItemAttributes, ComposedRows, torch.Tensor]:
    attrs = attributes(columns)
    gen = torch.Generator().manual_seed(seed)
    rows = ComposedRows(attrs, width, dtype=dtype, generator=gen)
    id_table = torch.empty(attrs.n_warm, width, dtype=dtype).uniform_(-1, 1, generator=gen)
    return attrs, rows, id_table


def numpy_params(rows: ComposedRows) -> tuple[list[np.ndarray], np.ndarray | None]:
    return ([t.detach().numpy() for t in rows.tables],
            None if rows.projection is None else rows.projection.detach().numpy())


# A batch as a step has it: repeated items (targets and shared samples overlap), in any order.
_BATCH = [3, 0, 3, 7, 1, 2, 2, 4, 5, 6, 0, 3]
# With the cold items 8, 9, 10 (evaluation, inference).
_WITH_COLD = _BATCH + [8, 10, 9, 8]

# ---------------------------------------------------------------------- the forward


def test_the_test_items_are_what_the_tests_assume() -> None:
    attrs = attributes(["category", "tags", "price", "weight"])
    assert (attrs.n_warm, attrs.n_items) == (8, 11)
    assert not attrs.has_row[7] and attrs.has_row[8:].all()
    tags = [attrs.codes[1][attrs.offsets[1][i]:attrs.offsets[1][i + 1]].tolist() for i in range(attrs.n_items)]
    assert [len(t) for t in tags] == [2, 1, 3, 1, 4, 1, 1, 1, 2, 1, 2]
    assert tags[2][0] == tags[2][1]  # "a|a|c": a value listed twice counts twice in the mean
    assert attrs.codes[0][9] == 0 and tags[9] == [0]  # values only cold items have are unknown


@pytest.mark.parametrize("columns", [["category"], ["tags"], ["price", "weight"], ["category", "tags", "price", "weight"]])
def test_compose_matches_the_numpy_reference(columns: list[str]) -> None:
    attrs, rows, id_table = setup(columns)
    tables, projection = numpy_params(rows)
    got = rows.compose(id_table, torch.tensor(_WITH_COLD))
    want = reference_rows(attrs, id_table.numpy(), tables, projection, _WITH_COLD)
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(want, id_table.numpy()[np.minimum(_WITH_COLD, attrs.n_warm - 1)])  # the attributes count


def test_a_multi_column_is_pooled_by_the_mean_of_its_values() -> None:
    attrs, rows, id_table = setup(["tags"])
    with torch.no_grad():
        rows.tables[0].copy_(torch.arange(rows.tables[0].numel(), dtype=torch.float64).view_as(rows.tables[0]))
    part = rows.attribute_part(torch.tensor([1, 6, 0, 4]))
    assert part is not None
    table = rows.tables[0].detach()

    def code(value: str) -> int:
        return 1 + attrs.encoding.categorical[0].vocabulary.get_loc(value)

    a, b, c, d = (code(v) for v in "abcd")
    torch.testing.assert_close(part[0], table[b])  # "b"
    torch.testing.assert_close(part[1], table[a])  # "a"
    torch.testing.assert_close(part[2], (table[a] + table[b]) / 2)  # "a|b": the mean, not the sum
    torch.testing.assert_close(part[3], (table[b] + table[c] + table[a] + table[d]) / 4)


def test_a_cold_item_is_its_attribute_part_alone() -> None:
    attrs, rows, id_table = setup(["category", "tags", "price"])
    cold = torch.arange(attrs.n_warm, attrs.n_items)
    assert torch.equal(rows.id_rows(id_table, cold), torch.zeros(len(cold), 5, dtype=torch.float64))
    part = rows.attribute_part(cold)
    assert part is not None
    torch.testing.assert_close(rows.compose(id_table, cold), part, rtol=0, atol=0)
    assert part.abs().min() > 0  # scored from its attributes: not zeros


def test_all_items_in_chunks_equal_the_batch() -> None:
    attrs, rows, id_table = setup(["category", "tags", "price", "weight"], dtype=torch.float32)
    every = rows.compose(id_table, torch.arange(attrs.n_items)).detach()
    budget = 3 * rows.bytes_per_item()
    bounds = rows.chunk_bounds(budget)
    assert bounds[0][0] == 0 and bounds[-1][1] == attrs.n_items and len(bounds) == 4
    assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))  # contiguous
    assert all((b - a) * rows.bytes_per_item() <= budget for a, b in bounds)
    out = torch.full((attrs.n_items, 5), float("nan"))
    by = torch.zeros(attrs.n_warm)
    assert rows.compose_all(id_table, by, budget_bytes=budget, out=out)[0] is out
    torch.testing.assert_close(out, every, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(rows.compose_all(id_table, by, budget_bytes=1)[0], every, rtol=1e-6, atol=1e-7)  # one item each
    torch.testing.assert_close(rows.compose_all(id_table, by)[0], every, rtol=1e-6, atol=1e-7)  # one chunk


def test_without_attribute_columns_the_rows_are_the_id_rows_bit_for_bit() -> None:
    attrs, rows, id_table = setup([], dtype=torch.float32)
    assert (attrs.n_warm, attrs.n_items) == (8, 11) and not rows.has_attributes  # ids only, cold items too
    id_table[0, 0] = -0.0  # adding a zero part (x + 0.0) would turn it into +0.0: different bits
    assert rows.sparse_parameters() == {} and rows.dense_parameters() == {}
    items = torch.tensor(_BATCH)
    got = rows.compose(id_table, items)
    want = id_table.index_select(0, items)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # the bits, signed zeros included
    every = rows.compose_all(id_table, torch.zeros(attrs.n_warm))[0]
    assert torch.equal(every[:8].view(torch.int32), id_table.view(torch.int32))
    assert torch.equal(every[8:].view(torch.int32), torch.zeros(3, 5, dtype=torch.int32))  # nothing to score them by
    g = torch.randn(len(_BATCH), 5, generator=torch.Generator().manual_seed(1))
    grads = rows.backward(items, g)
    assert grads.tables == {} and grads.projection is None
    dense = torch.zeros_like(id_table).index_add_(0, items, g)
    assert grads.id.rows.tolist() == sorted(set(_BATCH))
    torch.testing.assert_close(grads.id.grad, dense[grads.id.rows], rtol=0, atol=0)


def test_bad_arguments_name_the_culprit() -> None:
    attrs, rows, id_table = setup(["category"])
    with pytest.raises(ValueError, match=r"id table is \(7, 5\), expected \(8, 5\)"):
        rows.compose(id_table[:7], torch.tensor([0]))
    with pytest.raises(ValueError, match="width=0"):
        ComposedRows(attrs, 0)
    with pytest.raises(ValueError, match="budget_bytes=0"):
        rows.chunk_bounds(0)
    table = item_table_from_frame(_FRAME[["ItemId", "category"]], types={"category": "categorical"})
    with pytest.raises(ValueError, match="no training item"):
        ComposedRows(ItemAttributes.build(table, ItemMap.from_ids(pd.Series([], dtype="int64"))), 5)

# ---------------------------------------------------------------------- the backward


def dense_of(grads: RowGrads, rows: ComposedRows, id_table: torch.Tensor) -> list[torch.Tensor]:
    """The row gradients scattered into full-size tables: id table, attribute tables, projection.
    Also checks their form: unique, ascending, in range."""
    out = []
    for (r, g), table in [(grads.id, id_table), *[(grads.tables[n], t) for n, t in rows.sparse_parameters().items()]]:
        assert torch.equal(r, torch.unique(r)) and (r.numel() == 0 or 0 <= int(r.min()) <= int(r.max()) < len(table))
        out.append(torch.zeros_like(table).index_copy_(0, r, g))
    if rows.projection is not None:
        assert grads.projection is not None
        out.append(grads.projection)
    return out


@pytest.mark.parametrize("columns", [["category"], ["tags"], ["price", "weight"], ["category", "tags", "price", "weight"]])
def test_backward_matches_autograd(columns: list[str]) -> None:
    attrs, rows, id_table = setup(columns)
    id_table.requires_grad_(True)
    items = torch.tensor(_WITH_COLD)
    g = torch.randn(len(_WITH_COLD), 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (rows.compose(id_table, items) * g).sum().backward()
    params = [id_table, *rows.tables] + ([rows.projection] if rows.projection is not None else [])
    got = dense_of(rows.backward(items, g), rows, id_table)
    for p, mine in zip(params, got, strict=True):
        assert p.grad is not None
        torch.testing.assert_close(mine, p.grad, rtol=1e-12, atol=1e-12)
    # exactly the rows the batch reads: the warm items' id rows (no cold item's), the codes it has
    grads = rows.backward(items, g)
    assert grads.id.rows.tolist() == sorted({i for i in _WITH_COLD if i < attrs.n_warm})
    for c, name in enumerate(rows.sparse_parameters()):
        read = {int(k) for i in _WITH_COLD for k in attrs.codes[c][attrs.offsets[c][i]:attrs.offsets[c][i + 1]]}
        assert grads.tables[name].rows.tolist() == sorted(read)


def test_backward_matches_finite_differences() -> None:
    """A non-linear loss of a tiny float64 composition: every parameter entry's central
    difference against the row gradients the backward gives for dL/d(row)."""
    attrs, rows, id_table = setup(["category", "tags", "price", "weight"], width=3)
    items = torch.tensor([2, 4, 2, 9, 0, 8])
    w = torch.randn(len(items), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def loss() -> float:
        with torch.no_grad():
            return float((torch.tanh(rows.compose(id_table, items)) * w).sum())

    with torch.no_grad():
        dl_drow = w * (1 - torch.tanh(rows.compose(id_table, items)) ** 2)
    got = dense_of(rows.backward(items, dl_drow), rows, id_table)
    params = [id_table, *[t.data for t in rows.tables], rows.projection.data]  # type: ignore[union-attr]
    h = 1e-6
    for p, mine in zip(params, got, strict=True):
        fd = torch.zeros_like(p)
        for k in range(p.numel()):
            flat = p.view(-1)
            old = float(flat[k])
            flat[k] = old + h
            up = loss()
            flat[k] = old - h
            down = loss()
            flat[k] = old
            fd.view(-1)[k] = (up - down) / (2 * h)
        torch.testing.assert_close(mine, fd, rtol=1e-7, atol=1e-8)
        assert fd.abs().max() > 0.01  # every parameter block takes part


def test_a_repeated_item_gets_the_sum_of_its_positions_gradients() -> None:
    attrs, rows, id_table = setup(["category", "tags", "price"])
    items = torch.tensor([4, 1, 4, 4])
    g = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    once = rows.backward(torch.tensor([1, 4]), torch.stack([g[1], g[0] + g[2] + g[3]]))
    many = rows.backward(items, g)
    assert many.id.rows.tolist() == [1, 4]
    torch.testing.assert_close(many.id.grad, torch.stack([g[1], g[0] + g[2] + g[3]]), rtol=0, atol=0)
    for name in rows.sparse_parameters():
        assert torch.equal(many.tables[name].rows, once.tables[name].rows)
        torch.testing.assert_close(many.tables[name].grad, once.tables[name].grad, rtol=1e-12, atol=1e-12)
    assert many.projection is not None and once.projection is not None
    torch.testing.assert_close(many.projection, once.projection, rtol=1e-12, atol=1e-12)
    # item 4 is "b|c|a|d", item 1 "b": code b gets g1 + (g0 + g2 + g3)/4
    b = 1 + attrs.encoding.categorical[1].vocabulary.get_loc("b")
    at = many.tables["cat1"].rows.tolist().index(b)
    torch.testing.assert_close(many.tables["cat1"].grad[at], g[1] + (g[0] + g[2] + g[3]) / 4)


def test_the_optimiser_applies_the_row_gradients_as_it_applies_full_ones() -> None:
    """The wiring's form: the attribute tables as sparse tables, the projection as a dense
    parameter, the row gradients as UniqueGrad. Adagrad without momentum or L2 leaves a row whose
    gradient is zero unchanged, so full-size autograd gradients on a copy are the reference."""
    attrs, rows, id_table = setup(["category", "tags", "price", "weight"], dtype=torch.float32)
    items = torch.tensor(_BATCH)
    g = torch.randn(len(_BATCH), 5, generator=torch.Generator().manual_seed(5))
    config = Config(adapt="adagrad", learning_rate=0.1, momentum=0.0, lmbd=0.0)

    def tables(id_t: torch.Tensor, r: ComposedRows) -> tuple[dict[str, torch.nn.Parameter], dict[str, torch.nn.Parameter]]:
        return r.dense_parameters(), {"Wy": torch.nn.Parameter(id_t), **r.sparse_parameters()}

    ref_rows = ComposedRows(attrs, 5)
    ref_rows.load_state_dict(rows.state_dict())
    ref_id = id_table.clone().requires_grad_(True)
    (ref_rows.compose(ref_id, items) * g).sum().backward()
    dense, sparse = tables(ref_id.detach(), ref_rows)
    ref_opt = Optimizer(dense, sparse, config)
    assert ref_rows.projection is not None and ref_rows.projection.grad is not None
    every = {"Wy": ref_id.grad, **{n: p.grad for n, p in ref_rows.sparse_parameters().items()}}
    ref_opt.step([ref_rows.projection.grad], {n: UniqueGrad(torch.arange(len(gr)), gr) for n, gr in every.items()
                                              if gr is not None})

    grads = rows.backward(items, g)
    dense, sparse = tables(id_table, rows)
    opt = Optimizer(dense, sparse, config)
    assert grads.projection is not None
    opt.step([grads.projection], {"Wy": UniqueGrad(*grads.id), **{n: UniqueGrad(*rg) for n, rg in grads.tables.items()}})
    assert not torch.equal(rows.tables[0], ComposedRows(attrs, 5, generator=torch.Generator().manual_seed(0)).tables[0])
    for mine, ref in zip([sparse["Wy"], *rows.tables, rows.projection], [ref_opt.sparse["Wy"], *ref_rows.tables,
                                                                         ref_rows.projection], strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-6, atol=1e-7)

# ---------------------------------------------------------------------- initialisation


def test_initialisation_follows_the_item_tables_rule_seeded() -> None:
    attrs = attributes(["category", "tags", "price"])
    a = ComposedRows(attrs, 4, generator=torch.Generator().manual_seed(7))
    b = ComposedRows(attrs, 4, generator=torch.Generator().manual_seed(7))
    c = ComposedRows(attrs, 4, generator=torch.Generator().manual_seed(8))
    for x, y, z in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(x, y) and not torch.equal(x, z)
    values = torch.cat([p.detach().reshape(-1) for p in a.parameters()])
    sigma = math.sqrt(6.0 / (attrs.n_warm + 4))  # GRU4RecNet's sqrt(6/(rows + cols)) of the item table
    assert values.abs().max() <= sigma and values.abs().max() > 0.8 * sigma
    a.reset_parameters(sigma=0.05, generator=torch.Generator().manual_seed(7))
    values = torch.cat([p.detach().reshape(-1) for p in a.parameters()])
    assert values.abs().max() <= 0.05 and values.abs().max() > 0.04
    big = ComposedRows(attributes(["category", "tags", "price"]), 400)
    big.reset_parameters(normal=True, n_rows=1000, generator=torch.Generator().manual_seed(7))
    values = torch.cat([p.detach().reshape(-1) for p in big.parameters()])
    assert abs(float(values.std()) / math.sqrt(6.0 / 1400) - 1) < 0.05 and values.abs().max() > math.sqrt(6.0 / 1400)
