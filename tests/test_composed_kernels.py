"""The fused CPU kernels of the composed item rows (gru4rec.kernels.cpu_composed.ComposedTables: compose,
grads) behind ComposedRows.compose_warm and ComposedRows.table_grads with ``kernels``, which FastStep
uses on the CPU: the rows and biases against a NumPy reference written item by item and against
the PyTorch path bit for bit (the same sums in the same order); the tables' gradients against
NumPy sums per code and, bit for bit, against what the optimiser made of the PyTorch path's rows
(unique rows, then their sum); the step hands the summed rows over as unique rows; the arguments
are checked. Also LogQ.columns, gathered without a concatenation, against the concatenation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.items.rows import ComposedRows, RowGrad, unknown_id_bias
from gru4rec.kernels.cpu import CpuKernels, cpu_kernels
from gru4rec.training.optim import Optimizer
from gru4rec.training.sampling import LogQ

KERNELS = cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="the fused CPU kernels cannot be built here")

# Training items 10..19 (19 has no row: unknown codes, numbers 0); 90, 91 are cold.
_TRAIN = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
_FRAME = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 14, 15, 16, 17, 18, 90, 91],
    "category": ["x", "y", "x", "z", "y", "x", "w", "z", "y", "y", "q"],
    "brand": ["b1", "b2", "b3", "b1", "b1", "b2", "b4", "b3", "b2", "b1", "b5"],
    "tags": ["a|b", "b", "a|a|c", "c", "b|c|a|d", "d", "a", "c|d", "b", "a|b", "e"],
    "price": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.5, 3.0, 2.5, 3.0, 9.0],
})
_TYPES = {"category": "categorical", "brand": "categorical", "tags": "multi", "price": "numeric"}
# A step's distinct items in any order, and a batch with repeats (the reference step's columns).
_DISTINCT = [3, 0, 7, 1, 9, 2, 4, 8, 5, 6]
_REPEATS = [3, 0, 3, 7, 1, 2, 2, 4, 5, 6, 0, 3, 9, 9, 8]
COLUMN_SETS = [["category"], ["category", "brand"], ["category", "brand", "tags", "price"], ["tags"], []]


def kernels() -> CpuKernels:
    assert KERNELS is not None
    return KERNELS


def setup(columns: list[str], *, bias: bool = True, width: int = 6, seed: int = 0
          ) -> tuple[ItemAttributes, ComposedRows, torch.Tensor, torch.Tensor]:
    """float32 composed rows over ``columns`` with random tables (the bias column too), id rows and biases."""
    table = item_table_from_frame(_FRAME[["ItemId", *columns]], types={c: _TYPES[c] for c in columns})
    attrs = ItemAttributes.build(table, ItemMap.from_ids(pd.Series(_TRAIN)))
    gen = torch.Generator().manual_seed(seed)
    rows = ComposedRows(attrs, width, bias=bias, generator=gen)
    with torch.no_grad():
        for p in rows.parameters():
            p.uniform_(-1, 1, generator=gen)  # the bias column too (it starts at 0)
    id_table = torch.empty(attrs.n_warm, width).uniform_(-1, 1, generator=gen)
    id_bias = torch.empty(attrs.n_warm).uniform_(-1, 1, generator=gen)
    return attrs, rows, id_table, id_bias


def numpy_composition(attrs: ItemAttributes, rows: ComposedRows, id_table: torch.Tensor, id_bias: torch.Tensor,
                      items: list[int], keep: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Each item's row and bias one item at a time in float64: id row and bias (zeros and the
    mean id bias where dropped) + per categorical column its code's row, or its codes' mean
    for a multi column, + its numbers times the projection; the bias from the last column."""
    tables = [t.detach().double().numpy() for t in rows.tables]
    projection = None if rows.projection is None else rows.projection.detach().double().numpy()
    w = rows.width
    out, out_bias = [], []
    for i, kept in zip(items, keep, strict=True):
        part = np.zeros(rows.columns)
        for c, enc in enumerate(attrs.encoding.categorical):
            codes = attrs.codes[c][attrs.offsets[c][i]:attrs.offsets[c][i + 1]]
            part += sum(tables[c][k] for k in codes) / (len(codes) if enc.multi else 1)
        if projection is not None:
            part += attrs.numeric[i].astype(np.float64) @ projection
        row = (id_table[i].double().numpy() if kept else np.zeros(w)) + part[:w]
        b = float(id_bias[i]) if kept else float(id_bias.double().mean())
        out.append(row)
        out_bias.append(b + (part[w] if rows.bias else 0.0))
    return np.stack(out), np.array(out_bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("columns", COLUMN_SETS)
@pytest.mark.parametrize("dropped", [False, True])
def test_fused_composition_is_the_torch_composition_bit_for_bit(columns: list[str], bias: bool, dropped: bool) -> None:
    attrs, rows, id_table, id_bias = setup(columns, bias=bias)
    items = torch.tensor(_DISTINCT)
    keep = torch.tensor([k % 3 != 1 for k in range(len(_DISTINCT))]) if dropped else None
    got, got_bias = rows.compose_warm(id_table, items, keep, id_bias, kernels())
    want, want_bias = rows.compose_warm(id_table, items, keep, id_bias)
    assert got_bias is not None and want_bias is not None
    assert torch.equal(got, want) and torch.equal(got_bias, want_bias)
    ref, ref_bias = numpy_composition(attrs, rows, id_table, id_bias, _DISTINCT,
                                      [True] * len(_DISTINCT) if keep is None else keep.tolist())
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_bias.double().numpy(), ref_bias, rtol=1e-6, atol=1e-6)
    if dropped:  # the dropped items' id part and bias are gone (the test can fail)
        assert not torch.equal(got, rows.compose_warm(id_table, items, None, id_bias, kernels())[0])
    # without the biases: the same rows, and no bias
    rows_only, none = rows.compose_warm(id_table, items, keep, None, kernels())
    assert none is None and torch.equal(rows_only, want)


def test_the_mean_id_bias_of_a_dropped_item_is_the_unknown_one() -> None:
    _, rows, id_table, id_bias = setup(["category", "brand"])
    items = torch.tensor(_DISTINCT)
    keep = torch.zeros(len(_DISTINCT), dtype=torch.bool)
    _, got = rows.compose_warm(id_table, items, keep, id_bias, kernels())
    _, no_id = rows.compose_warm(torch.zeros_like(id_table), items, None, torch.zeros_like(id_bias), kernels())
    assert got is not None and no_id is not None
    torch.testing.assert_close(got, no_id + unknown_id_bias(id_bias), rtol=0, atol=1e-6)


def numpy_code_sums(attrs: ItemAttributes, rows: ComposedRows, items: list[int], g: np.ndarray,
                    gb: np.ndarray | None) -> dict[str, dict[int, np.ndarray]]:
    """Each one-code column's gradient per code it reads: the sum over the items that read it
    of [g | gb] (gb 0 past its length, and no bias column without ``bias``)."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for c, enc in enumerate(attrs.encoding.categorical):
        if enc.multi:
            continue
        sums: dict[int, np.ndarray] = {}
        for k, i in enumerate(items):
            code = int(attrs.codes[c][i])
            row = np.append(g[k], gb[k] if gb is not None and k < len(gb) else 0.0) if rows.bias else g[k]
            sums[code] = sums.get(code, 0.0) + row
        out[f"cat{c}"] = sums
    return out


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("items", [_DISTINCT, _REPEATS], ids=["distinct", "repeats"])
@pytest.mark.parametrize("n_bias", [None, 0, 4, "all"])
def test_fused_table_gradients_are_the_sums_per_code(items: list[int], bias: bool, n_bias: int | str | None) -> None:
    attrs, rows, _, _ = setup(["category", "brand", "tags", "price"], bias=bias)
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(len(items), rows.width, generator=gen)
    gb = None if n_bias is None else torch.randn(len(items) if n_bias == "all" else int(n_bias), generator=gen)
    t = torch.tensor(items)
    got = rows.table_grads(t, g, gb, kernels=kernels())
    plain = rows.table_grads(t, g, gb)  # one row per code read
    assert got.keys() == plain.keys() == {"cat0", "cat1", "cat2"}
    assert rows.names == ["category", "brand", "tags"]
    assert torch.equal(got["cat2"][1], plain["cat2"][1])  # the multi column: PyTorch's rows either way
    want = numpy_code_sums(attrs, rows, items, g.double().numpy(), None if gb is None else gb.double().numpy())
    for name in ("cat0", "cat1"):  # the one-code columns (category, brand): summed per distinct code
        codes, rows_g = got[name]
        assert isinstance(got[name], RowGrad) and codes.tolist() == sorted(want[name])
        np.testing.assert_allclose(rows_g.double().numpy(), np.stack([want[name][k] for k in sorted(want[name])]),
                                   rtol=1e-6, atol=1e-6)
        # bit for bit what the optimiser's unique rows made of PyTorch's rows: the same sums in the same order
        uniq, inverse = torch.empty(len(items), dtype=torch.int64), torch.empty(len(items), dtype=torch.int64)
        n_codes = rows.tables[int(name[3:])].shape[0]
        k, _ = kernels().unique(plain[name][0], torch.zeros(n_codes, dtype=torch.uint8), torch.zeros(n_codes, dtype=torch.int64),
                                uniq, inverse)
        total = torch.zeros(k, rows.columns)
        kernels().add_rows(total, inverse, plain[name][1].contiguous())
        assert torch.equal(codes, uniq[:k]) and torch.equal(rows_g, total)
    # the scratch marks are left zero: a second call gives the same
    again = rows.table_grads(t, g, gb, kernels=kernels())
    assert all(torch.equal(a, b) for name in got for a, b in zip(got[name], again[name], strict=True))


def test_the_step_hands_rows_summed_per_code_as_unique_rows() -> None:
    """StepComposition.grads gives the optimiser a one-code table's kernel-summed rows of a step's
    one part as unique rows (not summed again); two parts (the reference step's columns and
    inputs in shared mode), or a multi column's rows, stay rows to sum."""
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.training.composed import Part, StepComposition
    from gru4rec.training.optim import UniqueGrad

    table = item_table_from_frame(_FRAME[["ItemId", "category", "tags"]], types={"category": "categorical", "tags": "multi"})
    attrs = ItemAttributes.build(table, ItemMap.from_ids(pd.Series(_TRAIN)))
    config = Config(layers=(6,), adapt="adagrad", momentum=0.0, lmbd=0.0)
    net = GRU4RecNet(len(_TRAIN), config, attributes=attrs)
    opt = Optimizer(net.dense_parameters(), net.sparse_parameters(), config)
    assert opt.kernels is not None and opt.unique_rows
    comp = StepComposition(net, opt)
    items = torch.tensor(_REPEATS)
    g = torch.randn(len(_REPEATS), 6, generator=torch.Generator().manual_seed(4))
    g_bias = torch.randn(len(_REPEATS), generator=torch.Generator().manual_seed(5))
    want = net.attributes.table_grads(items, g, g_bias, kernels=kernels())["cat0"]  # type: ignore[union-attr]
    sparse, _ = comp.grads([Part(items, g, g_bias, None)])
    got = sparse["attributes.cat0"]
    assert isinstance(got, UniqueGrad) and torch.equal(got.rows, want.rows) and torch.equal(got.grad, want.grad)
    assert isinstance(sparse["attributes.cat1"], list)  # the multi column: rows per code read
    sparse, _ = comp.grads([Part(items, g, g_bias, None), Part(items, g, None, None, input=True)])
    assert isinstance(sparse["attributes.cat0"], list) and len(sparse["attributes.cat0"]) == 2
    # the optimiser sums two parts of kernel-summed rows like any rows
    twice = opt._sum_duplicates("attributes.cat0", [tuple(want), tuple(want)])
    assert torch.equal(twice[0], want.rows) and torch.equal(twice[1], 2 * want.grad)


def test_the_kernels_check_their_arguments() -> None:
    _, rows, id_table, id_bias = setup(["category", "brand"])
    tables = list(rows.tables)
    codes = [rows.cat0_codes, rows.cat1_codes]
    items = torch.tensor(_DISTINCT)
    k = kernels()
    with pytest.raises(ValueError, match="one codes table per table"):
        k.composition(tables, codes[:1])
    with pytest.raises(ValueError, match="one number of columns"):
        k.composition([tables[0], torch.zeros(3, 4)], codes)
    with pytest.raises(ValueError, match="codes\\[1\\] must lie in"):
        k.composition(tables, [codes[0], codes[1] + 100])
    bound = k.composition(tables, codes)
    with pytest.raises(ValueError, match="keep"):
        bound.compose(id_table, items, keep=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="id_table"):
        bound.compose(id_table.double(), items)
    with pytest.raises(ValueError, match="id_table has 4 columns"):
        bound.compose(id_table[:, :4].contiguous(), items)
    with pytest.raises(ValueError, match="g_rows must have a row per item"):
        bound.grads(items, torch.zeros(3, rows.width))
    with pytest.raises(ValueError, match="g_bias"):
        bound.grads(items, torch.zeros(len(_DISTINCT), rows.width), torch.zeros(2, dtype=torch.float64))
    with torch.no_grad():
        rows.tables[1].data = torch.zeros(rows.tables[1].shape[0] + 1, rows.columns)  # its storage changed shape: refused
    with pytest.raises(ValueError, match="tables\\[1\\] must stay"):
        bound.compose(id_table, items)


def test_a_copy_of_the_rows_binds_its_own_kernels() -> None:
    import copy
    _, rows, id_table, id_bias = setup(["category", "brand"])
    items = torch.tensor(_DISTINCT)
    want = rows.compose_warm(id_table, items, None, id_bias, kernels())
    twin = copy.deepcopy(rows)
    with torch.no_grad():
        rows.tables[0].add_(1.0)  # the original moves on; the copy composes from its own tables
    got = twin.compose_warm(id_table, items, None, id_bias, kernels())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_logq_columns_are_the_concatenated_terms() -> None:
    gen = torch.Generator().manual_seed(5)
    logq = LogQ(torch.randn(50, generator=gen), torch.randn(50, generator=gen))
    targets, samples = torch.randint(50, (8,), generator=gen), torch.randint(50, (30,), generator=gen)
    want = torch.cat((logq.in_batch[targets], logq.sampled[samples]))
    assert torch.equal(logq.columns(targets, samples), want)


def _step_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, ItemAttributes]:
    """Sessions of 40 items and their attributes: two one-code columns (5 and 3 values, shared
    by many items), a multi column of 1–3 tags, a price; items 0–3 have no row (unknown codes)."""
    from gru4rec.data import item_support, sessions_from_events
    from gru4rec.datasets.synthetic import generate
    events = generate(n_sessions=60, n_items=40, seed=11)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    ids = item_map.to_list()[4:]
    tags = ["a", "b|c", "c|a|a", "d", "b|d"]
    frame = pd.DataFrame({"ItemId": ids, "cat": [f"c{i % 5}" for i in range(len(ids))],
                          "brand": [f"b{i % 3}" for i in range(len(ids))], "tags": [tags[i % 5] for i in range(len(ids))],
                          "price": [1.0 + (i * 7 % 11) for i in range(len(ids))]})
    attrs = ItemAttributes.build(item_table_from_frame(frame, types={"tags": "multi"}), item_map)
    return sessions.items, sessions.offsets, item_support(sessions.items, len(item_map)), attrs


@pytest.mark.parametrize("reference", [False, True], ids=["fast-step", "reference-step"])
@pytest.mark.parametrize("extra", ["dropout_p_id=0.4", "constrained_embedding=False,embedding=10,dropout_p_id=0.3"],
                         ids=["shared-iddropout", "separate-iddropout"])
def test_steps_with_the_fused_composition_give_the_pytorch_compositions(reference: bool, extra: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Five float32 steps of the default CPU backend (the fused kernels: they compose the rows
    and sum the tables' gradients — FastStep's distinct items, and the reference step's columns
    with repeats and its input rows without biases) against the same steps without the kernels:
    the same losses, weights and optimiser state up to float32 rounding (the GRU's own kernels
    differ from PyTorch's in rounding only)."""
    from gru4rec.kernels.cpu_composed import ComposedTables
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.training.backend import select_backend
    from gru4rec.training.batching import build_schedule
    from gru4rec.training.trainer import Trainer
    items, offsets, support, attrs = _step_data()
    config = Config.from_string("batch_size=8,sample_store_size=48,learning_rate=0.1,sample_alpha=0.5,adapt=adagrad,layers=16,"
                                "n_sample=12,logq=1.0,momentum=0.2,dropout_p_embed=0.2," + extra)
    calls = {"compose": 0, "grads": 0}
    for name in calls:
        original = getattr(ComposedTables, name)

        def counted(self: ComposedTables, *a: object, _f: object = original, _n: str = name, **k: object) -> object:
            calls[_n] += 1
            return _f(self, *a, **k)  # type: ignore[operator]
        monkeypatch.setattr(ComposedTables, name, counted)
    results = []
    for switches in ({}, {"cpu_kernels": False}):
        backend = select_backend("cpu", torch.float32, **switches)
        schedule = build_schedule(items, offsets, config.batch_size, config.n_sample, torch.device("cpu"), torch.float32)
        net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed), attributes=attrs)
        trainer = Trainer(net, config, support, backend=backend, reference=reference)
        draws = torch.Generator().manual_seed(99)
        losses = []
        for t in range(5):
            samples = torch.randint(len(support), (config.n_sample,), generator=draws)
            inputs, targets, active, keep = (x[t] for x in (schedule.inputs, schedule.targets, schedule.active, schedule.keep))
            losses.append(float(trainer.train_step(inputs, targets, active, keep, samples)))
        results.append((losses, {k: v.detach().clone() for k, v in net.state_dict().items()},
                        {k: v.detach().clone() for k, v in trainer.optimizer.state_dict().items()}))
        if not switches:
            assert calls["compose"] >= 5 and calls["grads"] >= 5  # the kernels ran
            calls.update(compose=0, grads=0)
    assert calls == {"compose": 0, "grads": 0}  # and not without them
    (l1, w1, s1), (l2, w2, s2) = results
    assert l1 == pytest.approx(l2, rel=1e-6)
    for got, want in ((w1, w2), (s1, s2)):
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert float(w1["attributes.tables.1"][:, -1].abs().sum()) > 0  # the second one-code table's bias column learnt
