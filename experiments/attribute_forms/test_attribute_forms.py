"""The concatenated form of experiments/attribute_forms: trained, the id rows keep their last d
columns at zero and the attribute tables their first L − d row columns (the bias column and the
other columns move); the patch is undone after the block."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from experiments.attribute_forms.attribute_forms import concatenated, id_columns
from gru4rec import GRU4Rec
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.composed import StepComposition


def test_concatenated_form_keeps_the_parts_in_their_columns(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "gru4rec", "synth", str(tmp_path), "--kind", "intents-attributes", "--n-sessions", "300",
                    "--n-items", "60", "--n-intents", "4", "--seed", "3", "-q"], check=True, capture_output=True)
    model = GRU4Rec(layers=[8], n_epochs=1, batch_size=16, n_sample=16, dropout_p_id=0.3, device="cpu", threads=1)
    init, grads = GRU4RecNet.__init__, StepComposition.grads
    with concatenated(0.25):
        model.fit(tmp_path / "train_full.tsv", item_features=tmp_path / "items.tsv", progress=False)
    assert GRU4RecNet.__init__ is init and StepComposition.grads is grads  # restored
    net = model.net
    assert net is not None and net.attributes is not None
    split = id_columns(8, 0.25)
    assert split == 6
    assert torch.count_nonzero(net.Wy[:, split:]) == 0 and torch.count_nonzero(net.Wy[:, :split]) > 0
    for table in net.attributes.tables:
        assert torch.count_nonzero(table[:, :split]) == 0
        assert torch.count_nonzero(table[:, split:8]) > 0 and torch.count_nonzero(table[:, 8]) > 0  # row part, bias column
