"""Tiny trained models in each embedding mode and their test sessions, shared by the export tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from gru4rec import GRU4Rec
from gru4rec.datasets.synthetic import write_synthetic

TINY = "n_sample=16,n_epochs=2,batch_size=8,sample_store_size=1600,learning_rate=0.1"
#: One configuration per embedding mode, with more than one layer where it matters.
MODES = {
    "shared": "layers=8",
    "separate": "layers=8/6,embedding=5,constrained_embedding=False,hidden_act=elu-0.5",
    "none": "layers=7/5,embedding=0,constrained_embedding=False",
}


def synthetic(folder: Path) -> dict[str, Path]:
    return write_synthetic(folder, n_sessions=150, n_items=40, seed=3, test_days=6)


def train(data: dict[str, Path], mode: str, **overrides: Any) -> GRU4Rec:
    torch.set_num_threads(1)
    model = GRU4Rec(f"{MODES[mode]},{TINY}", device="cpu", seed=7, **overrides)
    model.fit(data["train_full"], progress=False)
    assert model.net is not None and model.net.mode == mode
    return model


def known_sessions(model: GRU4Rec, data: dict[str, Path], min_length: int = 1) -> list[list[Any]]:
    """The test file's sessions (item ids in time order, known items only), at least ``min_length`` long."""
    events = pd.read_csv(data["test"], sep="\t").sort_values(["SessionId", "Time"], kind="stable")
    assert model.item_map is not None
    events = events[events["ItemId"].isin(model.item_map.to_list())]
    sessions = events.groupby("SessionId", sort=False)["ItemId"].agg(list).tolist()
    return [s for s in sessions if len(s) >= min_length]
