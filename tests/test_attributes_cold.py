"""Cold items (issue 49): a model with item attributes scores, recommends and evaluates the cold
items of its attribute table — items no training event has — from their attributes alone.

The references are independent of the code under test: every composed row is built by hand in
NumPy from the attribute tables and the table's values, and the evaluation is checked against a
brute-force evaluator that ranks every target among the whole catalogue's hand-made scores, with
conservative (and standard) ties; two cold items with the same attributes tie exactly.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.config import Config
from gru4rec.data import ItemMap
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.items.rows import ComposedRows
from gru4rec.network.gru import GRU4RecNet

torch.set_num_threads(1)

ITEM_IDS = [10, 11, 12, 13, 14, 15]
SUPPORT = np.array([5, 3, 8, 1, 4, 2], dtype=np.int64)
# Item 14 has no row (unknown values); 97, 98, 99 are cold items, 98 and 99 with the same attributes.
TABLE = pd.DataFrame({
    "ItemId": [10, 11, 12, 13, 15, 97, 98, 99],
    "cat": ["a", "b", "a", "c", "b", "c", "a", "a"],
    "tags": ["x|y", "y", "z", "x|z|y", "y", "x|y", "z", "z"],
    "price": [1.0, 2.5, 0.5, 4.0, 3.0, 9.0, 2.0, 2.0],
})
COLD_IDS = [97, 98, 99]
CATALOGUE = ITEM_IDS + COLD_IDS
N, C = len(ITEM_IDS), len(COLD_IDS)


def model_with_attributes(mode: str = "shared", seed: int = 0) -> GRU4Rec:
    """An untrained GRU4Rec with attributes, its tables drawn at random (biases too)."""
    attrs = ItemAttributes.build(item_table_from_frame(TABLE, types={"tags": "multi"}), ItemMap.from_ids(pd.Series(ITEM_IDS)))
    kw: dict[str, object] = {"shared": dict(constrained_embedding=True),
                             "separate": dict(constrained_embedding=False, embedding=4),
                             "none": dict(constrained_embedding=False, embedding=0)}[mode]
    config = Config(layers=(5,), **kw)  # type: ignore[arg-type]  # the fields of one embedding mode
    model = GRU4Rec(config, device="cpu", threads=1)
    g = torch.Generator().manual_seed(seed)
    net = GRU4RecNet(N, config, generator=g, attributes=attrs)
    with torch.no_grad():
        net.By.copy_(torch.randn(N, generator=g))
        assert net.attributes is not None
        for rows in net.compositions().values():
            for table in rows.tables:
                table.copy_(torch.randn(table.shape, generator=g))
    model.net, model.item_map, model.item_support = net.eval(), ItemMap.from_ids(pd.Series(ITEM_IDS)), SUPPORT
    return model


def favour_cold(net: GRU4RecNet) -> None:
    """Craft ``net`` so that every cold item outranks every warm one: the warm items' id biases
    are -100, except item 14's, +500, so that their mean — a cold item's id bias
    (``unknown_id_bias``) — is 0; item 14, the only item of the catalogue without a row in the
    table (the unknown codes), gets -1000 from the unknown category's bias column and comes last."""
    assert net.attributes is not None
    with torch.no_grad():
        net.By.fill_(-100.0)
        net.By[ITEM_IDS.index(14)] = 100.0 * (N - 1)
        net.attributes.tables[0][0, -1] = -1000.0
    assert float(net.By.mean()) == 0.0


def rows_by_hand(model: GRU4Rec) -> tuple[np.ndarray, np.ndarray]:
    """Every catalogue item's composed row and bias in NumPy: [id row | By] (zeros for a cold
    item, with the mean id bias) + its category's row + the mean of its tags' rows + its standardised price · P, over
    the row's columns then the bias column (the tables' last)."""
    net = model.net
    assert net is not None and net.attributes is not None
    rows = _composed_by_hand(net.attributes, net.Wy.detach().numpy(), net.By.detach().numpy())
    return rows[:, :-1], rows[:, -1]


def input_rows_by_hand(model: GRU4Rec) -> np.ndarray:
    """Every catalogue item's composed input row in NumPy: the composed output row in shared
    mode; else its row of E or Wx_0 (zeros for a cold item) + its category's, tags' and price's
    parts from the input rows' own tables and projection (no bias column)."""
    net = model.net
    assert net is not None
    if net.mode == "shared":
        return rows_by_hand(model)[0]
    assert net.input_attributes is not None
    return _composed_by_hand(net.input_attributes, net.input_table.detach().numpy(), None)


def _composed_by_hand(composition: ComposedRows, id_table: np.ndarray, id_bias: np.ndarray | None) -> np.ndarray:
    """The composed rows of every catalogue item by ``composition`` over ``id_table`` (and with
    ``id_bias`` its bias column last), from TABLE itself."""
    assert composition.projection is not None
    attrs = ItemAttributes.build(item_table_from_frame(TABLE, types={"tags": "multi"}), ItemMap.from_ids(pd.Series(ITEM_IDS)))
    cat, tags = attrs.encoding.categorical
    price = attrs.encoding.numeric[0]
    t_cat, t_tags = (t.detach().numpy().astype(np.float64) for t in composition.tables)
    proj = composition.projection.detach().numpy().astype(np.float64)[0]
    wy = id_table.astype(np.float64)
    width = wy.shape[1]
    frame = TABLE.set_index("ItemId")
    rows = np.zeros((N + C, width + (id_bias is not None)))
    for i, item in enumerate(CATALOGUE):
        row = wy[i] if i < N else np.zeros(width)
        if id_bias is not None:  # a cold item's id bias: the mean (unknown_id_bias)
            row = np.append(row, id_bias[i] if i < N else id_bias.astype(np.float64).mean())
        if item in frame.index:
            row += t_cat[int(cat.codes_of(np.array([frame.at[item, "cat"]]))[0])]
            row += t_tags[tags.codes_of(np.array(frame.at[item, "tags"].split("|")))].mean(0)
            row += (frame.at[item, "price"] - price.mean) / price.std * proj
        else:  # no row: the unknown codes (0) and a standardised price of 0
            row += t_cat[0] + t_tags[0]
        rows[i] = row
    return rows


def test_catalogue_is_the_item_map_then_the_cold_items() -> None:
    model = model_with_attributes()
    assert model.catalogue is not None and model.item_map is not None
    assert list(model.catalogue.ids) == CATALOGUE
    assert len(model.item_map) == N  # the training items keep their map (supports, warm starts, files)
    plain = GRU4Rec(layers=[5], device="cpu")
    assert plain.catalogue is None


@pytest.mark.parametrize("mode", ["shared", "separate", "none"])
def test_scores_cover_the_cold_items_from_their_attributes(mode: str) -> None:
    model = model_with_attributes(mode)
    rows, bias = rows_by_hand(model)
    out = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    want = out.double().numpy() @ rows.T + bias
    with torch.no_grad():
        got = model.scores(out)
        assert got.shape == (3, N + C)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        buffer = torch.empty(3, N + C)
        model.scores(out, buffer=buffer)
        np.testing.assert_allclose(buffer.numpy(), want, rtol=1e-5, atol=1e-5)
    # the two cold items with the same attributes score the same, exactly
    assert torch.equal(got[:, CATALOGUE.index(98)], got[:, CATALOGUE.index(99)])


@pytest.mark.parametrize("mode", ["shared", "separate", "none"])
def test_a_clicked_cold_item_steps_the_state(mode: str) -> None:
    """A cold item is a known click: its input row is composed from its attributes in every mode
    (shared: its composed output row; separate and one-hot: the input rows' own attribute parts,
    as the input tables have no id row for it), never an index error; inference steps read the
    same rows from the composed input catalogue."""
    model = model_with_attributes(mode)
    net = model.net
    assert net is not None
    items = torch.tensor([CATALOGUE.index(97), 1, CATALOGUE.index(99)])
    want = torch.as_tensor(input_rows_by_hand(model)[items.numpy()], dtype=torch.float32)
    assert want.abs().min() > 0  # a cold item's row is not zeros
    with torch.no_grad():
        torch.testing.assert_close(net.input_rows(items), want, rtol=1e-5, atol=1e-5)
        hidden = net.init_hidden(3)
        h = net.step(items, hidden)  # the catalogue's rows (no_grad)
        want_h = net.run_layers(want, net.init_hidden(3))[-1]
        torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)


def test_recommend_returns_cold_items() -> None:
    model = model_with_attributes()
    net = model.net
    assert net is not None
    favour_cold(net)  # every warm item far below the cold ones
    rows, bias = rows_by_hand(model)
    with torch.no_grad():
        out = model.step(torch.tensor([2]), model.init_state(1))
    want = out.double().numpy() @ rows.T + bias
    order = np.argsort(-want[0], kind="stable")
    top = model.recommend([12], k=3)
    assert set(top.item_ids.tolist()) == set(COLD_IDS)
    assert want[0][CATALOGUE.index(top.item_ids[0])] == want[0][order[0]]  # the best (98 and 99 tie)
    np.testing.assert_allclose(top.scores, np.sort(want[0])[::-1][:3], rtol=1e-5, atol=1e-5)
    # a cold item clicked is known (not skipped), and exclude_seen drops it like any other item
    with pytest.warns() as record:
        warnings_free = model.recommend_batch([[12, 97], [555]], k=N + C, exclude_seen=True)
    assert any("1 unknown item id" in str(w.message) for w in record)  # only 555
    assert 97 not in warnings_free[0].item_ids.tolist() and len(warnings_free[0].item_ids) == N + C - 2
    assert warnings_free[1].fallback and set(warnings_free[1].item_ids[-C:].tolist()) == set(COLD_IDS)  # no support: last
    scores = model.score_sessions([[12], [12, 97]])
    assert scores.shape == (2, N + C)
    np.testing.assert_allclose(scores[0], want[0], rtol=1e-5, atol=1e-5)
    frame = model.predict_next_batch([1], [12], predict_for_item_ids=[98, 10])
    np.testing.assert_allclose(frame[0].to_numpy(), want[0][[CATALOGUE.index(98), 0]], rtol=1e-5, atol=1e-5)


# Test sessions: cold items as targets and as clicks, an unknown item (555, in no table) dropped.
TEST = pd.DataFrame({
    "SessionId": [1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4],
    "ItemId": [10, 97, 12, 98, 11, 555, 99, 13, 14, 10, 98, 99, 97],
    "Time": np.arange(13),
})


def brute_force(model: GRU4Rec, cutoffs: tuple[int, ...], mode: str) -> dict[str, tuple[int, dict[int, float], dict[int, float]]]:
    """Recall/MRR on all, warm and cold targets: each session fed click by click from a zero
    state, every target ranked by hand among the catalogue's hand-made scores."""
    rows, bias = rows_by_hand(model)
    ranks: dict[str, list[float]] = {"all": [], "warm": [], "cold": []}
    for _, session in TEST.groupby("SessionId", sort=False):
        items = [CATALOGUE.index(i) for i in session["ItemId"] if i in CATALOGUE]
        state = model.init_state(1)
        for click, target in zip(items[:-1], items[1:]):
            with torch.no_grad():
                out = model.step(torch.tensor([click]), state).double().numpy()[0]
            scores = out @ rows.T + bias
            t = scores[target]
            # scores within float32 rounding of the target's count as ties (the two equal cold rows)
            close = np.isclose(scores, t, rtol=1e-6, atol=1e-6)
            above = int(((scores > t) & ~close).sum())
            rank = float(above + close.sum()) if mode == "conservative" else float(above + 1)
            for group in ("all", "cold" if target >= N else "warm"):
                ranks[group].append(rank)
    result = {}
    for group, r in ranks.items():
        a = np.array(r)
        result[group] = (len(a), {c: float((a <= c).mean()) if len(a) else 0.0 for c in cutoffs},
                         {c: float(np.where(a <= c, 1.0 / a, 0.0).mean()) if len(a) else 0.0 for c in cutoffs})
    return result


@pytest.mark.parametrize("mode", ["conservative", "standard"])
@pytest.mark.parametrize("embedding", ["shared", "separate"])
def test_evaluate_keeps_cold_targets_and_splits_all_warm_cold(mode: str, embedding: str) -> None:
    model = model_with_attributes(embedding, seed=3)
    cutoffs = (1, 2, 3, 5)
    want = brute_force(model, cutoffs, mode)
    assert want["cold"][0] == 5 and want["warm"][0] == 3  # cold targets are there to be ranked
    result = evaluate(model, TEST, cutoffs=cutoffs, mode=mode)  # type: ignore[arg-type]  # a tie mode
    assert result.n_items == N + C and result.n_cold_items == C
    assert result.n_dropped_events == 1  # 555 only: the cold items' events are kept
    assert result.ranks is None  # the split's ranks are not handed out unless asked for
    groups = {g.label: g for g in result.target_groups}
    assert list(groups) == ["all", "warm", "cold"]
    for label, (n, recall, mrr) in want.items():
        assert groups[label].n_predictions == n
        for c in cutoffs:
            assert groups[label].recall[c] == pytest.approx(recall[c], abs=1e-12), (label, c)
            assert groups[label].mrr[c] == pytest.approx(mrr[c], abs=1e-12), (label, c)
    for c in cutoffs:  # the whole evaluation's figures are the 'all' group's
        assert result.recall[c] == pytest.approx(want["all"][1][c], abs=1e-12)
        assert result.mrr[c] == pytest.approx(want["all"][2][c], abs=1e-12)
    lines = result.summary().splitlines()
    assert any(line.startswith("cold (n=5): Recall@1: ") for line in lines)
    assert result.to_dict()["targets"]["cold"]["n_predictions"] == 5


def test_the_conservative_tie_between_two_equal_cold_items_counts() -> None:
    """The two cold items with the same attributes tie: conservative ranks a target among them
    one lower than standard (the brute force above sees the same)."""
    model = model_with_attributes(seed=3)
    conservative = evaluate(model, TEST, cutoffs=(N + C,), mode="conservative", return_ranks=True)
    standard = evaluate(model, TEST, cutoffs=(N + C,), mode="standard", return_ranks=True)
    assert conservative.ranks is not None and standard.ranks is not None
    diff = conservative.ranks - standard.ranks
    assert diff.max() >= 1.0  # some target tied (98 or 99)
    assert diff.min() >= 0.0


def test_plain_model_drops_cold_targets_and_reports_an_empty_cold_group() -> None:
    """A plain model knows no cold item: their events are dropped as unknown, as before; its
    cold group is empty and reports 0; its output is what it was (no extra summary lines)."""
    config = Config(layers=(5,), constrained_embedding=True)
    model = GRU4Rec(config, device="cpu", threads=1)
    model.net = GRU4RecNet(N, config, generator=torch.Generator().manual_seed(0)).eval()
    model.item_map, model.item_support = ItemMap.from_ids(pd.Series(ITEM_IDS)), SUPPORT
    assert list(model.catalogue.ids) == ITEM_IDS  # type: ignore[union-attr]  # fitted
    result = evaluate(model, TEST, cutoffs=(3,), mode="conservative")
    assert result.n_dropped_events == 7 and result.n_items == N and result.n_cold_items == 0
    groups = {g.label: g for g in result.target_groups}
    assert groups["cold"].n_predictions == 0 and groups["cold"].recall[3] == 0.0 and groups["cold"].mrr[3] == 0.0
    assert groups["all"].recall[3] == result.recall[3] == groups["warm"].recall[3]
    assert "cold (n=" not in result.summary() and "targets" not in result.to_dict()


def test_the_serving_engine_ranks_and_takes_cold_items() -> None:
    """The server's batched path (``Engine.run``): a cold id is a known click and can be the answer."""
    from gru4rec.inference import Engine, Work

    model = model_with_attributes()
    net = model.net
    assert net is not None
    favour_cold(net)  # the cold items come first
    engine = Engine(model)
    assert engine.n_items == N + C and engine.item_ids == CATALOGUE
    known, unknown = engine.index_of([97, 12, 555])
    assert known.tolist() == [CATALOGUE.index(97), 2] and unknown == [555]
    rows, bias = rows_by_hand(model)
    with torch.no_grad():
        state = model.init_state(1)
        model.step(torch.tensor([CATALOGUE.index(97)]), state)
        out = model.step(torch.tensor([2]), state)
    want = out.double().numpy()[0] @ rows.T + bias
    answers = engine.run([Work(None, known, 3), Work(None, np.array([2], dtype=np.int64), 2, exclude_seen=True)])
    # (98 and 99 tie exactly: their order is torch.topk's, so the answer is checked as a set and by its scores)
    assert set(answers[0].items.tolist()) == {N, N + 1, N + 2}  # the three cold items
    assert answers[0].scores is not None
    np.testing.assert_allclose(answers[0].scores, np.sort(want)[::-1][:3], rtol=1e-5, atol=1e-5)
    assert set(answers[1].items.tolist()) <= {N, N + 1, N + 2}


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_a_catalogue_grown_in_the_process_scores_and_steps_its_new_items(mode: str) -> None:
    """extend_catalogue (what items add does) on a network that has scored and stepped already:
    the kept catalogues are composed again at the new size — the old items' scores unchanged bit
    for bit, the new item scored and clickable (it raised a shape error before the catalogues
    were kept by ComposedCatalogue)."""
    model = model_with_attributes(mode)
    net = model.net
    assert net is not None and net.attributes is not None
    out = torch.randn(2, 5, generator=torch.Generator().manual_seed(2))
    new = item_table_from_frame(pd.DataFrame({"ItemId": [500], "cat": ["a"], "tags": ["x"], "price": [1.0]}),
                                types={"tags": "multi"})
    with torch.no_grad():
        before = net.score_all(out)
        net.step(torch.tensor([0, 1]), net.init_hidden(2))
        net.extend_catalogue(net.attributes.source.add_items(new))
        after = net.score_all(out)
        assert after.shape == (2, N + C + 1) and torch.equal(after[:, : N + C], before)
        clicked = torch.tensor([N + C])
        torch.testing.assert_close(net.step(clicked, net.init_hidden(1)),
                                   net.run_layers(net.input_rows(clicked), net.init_hidden(1))[-1], rtol=0, atol=0)
