#!/usr/bin/env python
"""GRU4Rec from Python, end to end on the synthetic data set.

Generates the data, trains, evaluates, saves, loads the file back and recommends for a live
session — about 20-40 s on 2 CPU cores with the defaults below:

    python examples/quickstart.py [--workdir DIR] [--n-sessions N] [--epochs E] [--device cpu]

The command-line equivalent is ``gru4rec demo`` (see examples/cli.sh for each step).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gru4rec import Config, GRU4Rec, evaluate
from gru4rec.datasets.synthetic import write_synthetic


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the tour; returns the test metrics (``recall@20``, ``mrr@20``, ...)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None, help="folder for data and model (default: a temporary one)")
    parser.add_argument("--n-sessions", type=int, default=25_000, help="synthetic sessions (default: 25000)")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (default: 5)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default: auto)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gru4rec-quickstart-"))

    # 1. Data: four TSVs (SessionId, ItemId, Time), split by time like the public data sets.
    paths = write_synthetic(workdir / "data", n_sessions=args.n_sessions, seed=0, force=True)

    # 2. Hyperparameters: a parameter string here; Config.from_file("paramfiles/...py") reads the
    #    published best settings, and GRU4Rec(config, layers=(200,)) overrides single ones.
    config = Config.from_string(
        "loss=cross-entropy,layers=64,batch_size=32,n_sample=256,learning_rate=0.1,momentum=0.1,"
        "dropout_p_hidden=0.1,logq=1.0,sample_store_size=100000"
    ).replace(n_epochs=args.epochs)

    # 3. Train. fit() prints one line per epoch; the callback sees every epoch's statistics.
    losses: list[float] = []
    model = GRU4Rec(config, device=args.device).fit(
        paths["train_full"], callback=lambda info: losses.append(info.loss)
    )

    # 4. Evaluate: every next item ranked against all items; ties counted pessimistically.
    result = evaluate(model, paths["test"], cutoffs=(1, 5, 20), mode="conservative")
    print(result.summary())

    # 5. Save and load: one file, no pickle; the loaded model gives the same metrics.
    model_path = workdir / "model.safetensors"
    model.save(model_path, overwrite=True)
    loaded = GRU4Rec.load(model_path, device=args.device)
    again = evaluate(loaded, paths["test"], cutoffs=(1, 5, 20), mode="conservative")
    assert again.recall == result.recall and again.mrr == result.mrr

    # 6. Live recommendations for a session given the items clicked so far (oldest first).
    session = loaded.item_map.to_list()[:3]
    recs = loaded.recommend(session, k=5, exclude_seen=True)
    print(f"after {session}: recommend {recs.item_ids.tolist()} (scores {[round(float(s), 3) for s in recs.scores]})")

    print(f"loss by epoch: {[round(x, 4) for x in losses]}; data and model in {workdir}")
    return result.to_dict()


if __name__ == "__main__":
    main()
