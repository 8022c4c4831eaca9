"""DIGINETICA's real item attribute table (../shared/data/raw_samples/diginetica_product-categories.csv,
``;``-separated itemId;categoryId) through the item reader, aligned with the items of the raw
DIGINETICA sample beside it: the counts of known, unknown and cold items, the vocabulary and
every item's code against a plain-pandas computation."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec.data import ItemMap
from gru4rec.items import ItemAttributes, read_item_table

RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "raw_samples"
CATEGORIES = RAW / "diginetica_product-categories.csv"
SAMPLE = RAW / "diginetica_train-item-views_sample.csv"
pytestmark = pytest.mark.skipif(not (CATEGORIES.exists() and SAMPLE.exists()),
                                reason=f"real DIGINETICA attribute table or sample not found in {RAW}")


@pytest.fixture(scope="module")
def views() -> pd.DataFrame:
    return pd.read_csv(SAMPLE, sep=";")


def test_the_table_reads_as_one_categorical_column() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1,217 categories over 184,047 items: no cardinality warning
        table = read_item_table(CATEGORIES, item_key="itemId", types={"categoryId": "categorical"})
    raw = pd.read_csv(CATEGORIES, sep=";")
    assert len(table) == len(raw) == 184_047
    assert table.ids.dtype == np.int64 and table.ids.tolist() == raw["itemId"].tolist()
    assert table.kinds == {"categoryId": "categorical"}
    assert table.columns[0].values.tolist() == raw["categoryId"].tolist()
    assert len(np.unique(table.columns[0].values)) == raw["categoryId"].nunique() == 1_217
    # Without the override the integer category ids are numbers (the reader's rule for numeric columns).
    assert read_item_table(CATEGORIES, item_key="itemId").kinds == {"categoryId": "numeric"}


@pytest.mark.parametrize("min_count", [1, 5])
def test_aligned_with_the_sample_items(views: pd.DataFrame, min_count: int) -> None:
    """Training items: those viewed before the sample's last 7 days; the table's other rows are
    cold items, some of which the last 7 days view."""
    table = read_item_table(CATEGORIES, item_key="itemId", types={"categoryId": "categorical"})
    dates = pd.to_datetime(views["eventdate"])
    early = views[dates < dates.max() - pd.Timedelta(days=7)]
    late = views[dates >= dates.max() - pd.Timedelta(days=7)]
    train = ItemMap.from_ids(early["item_id"])
    attrs = ItemAttributes.build(table, train, min_count=min_count)

    raw = pd.read_csv(CATEGORIES, sep=";")
    train_ids = pd.Series(train.ids)
    known = int(train_ids.isin(raw["itemId"]).sum())
    cold_ids = raw.loc[~raw["itemId"].isin(train_ids), "itemId"]
    assert attrs.counts() == {"known": known, "unknown": len(train) - known, "cold": len(cold_ids)}
    assert known == len(train) > 1_000 and len(cold_ids) == 184_047 - len(train)
    assert attrs.item_map.to_list() == train.to_list() + cold_ids.tolist()
    # Cold items the last 7 days view: counted both ways.
    late_new = set(late["item_id"]) - set(early["item_id"])
    assert len(late_new) > 0
    assert int(np.isin(attrs.item_map.ids[attrs.n_warm:], list(late_new)).sum()) == len(late_new)

    # The vocabulary by pandas: categories of the training items, most items first, ties by first row.
    rows = raw[raw["itemId"].isin(train_ids)]
    counts = rows.groupby("categoryId", sort=False).size()
    first = rows.reset_index(drop=True).reset_index().groupby("categoryId", sort=False)["index"].min()
    order = pd.DataFrame({"n": counts, "first": first}).sort_values(["n", "first"], ascending=[False, True])
    vocab = order.index[order["n"] >= min_count].tolist()
    assert attrs.encoding.categorical[0].vocabulary.tolist() == vocab
    code_of = {c: i + 1 for i, c in enumerate(vocab)}
    category = raw.set_index("itemId")["categoryId"]
    want = [code_of.get(category[i], 0) for i in attrs.item_map.ids]
    assert attrs.codes[0].tolist() == want
    assert attrs.offsets[0].tolist() == list(range(attrs.n_items + 1))
    if min_count == 5:  # rare categories are unknown: some items share code 0
        assert 0 < want.count(0) < len(want)
