"""Plain GRU4Rec against GRU4Rec with click context (issue 49, point 3), on one pre-split data set.

    python -m benchmarks.train.click_context --data ../shared/data/rsc15_100k -pf paramfiles/rsc15_xe_shared_100_best.py

Trains the parameter file on ``train_full`` twice with the same seed — without and with
``click_context`` — and evaluates ``test`` (Recall@20, MRR@20, conservative ties). Both runs take
the autograd reference step, the only one that has the context (a plain network would otherwise
take the C step or FastStep, which round differently): the comparison is of the models, not of
the steps. Prints one JSON line per run. One thread (``--threads``): the accuracy figures do not
depend on it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gru4rec import Config, GRU4Rec, evaluate
from gru4rec.training import backend


def main(argv: list[str] | None = None) -> None:
    """Run both fits and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a folder with train_full.tsv and test.tsv")
    parser.add_argument("-pf", "--param-file", required=True)
    parser.add_argument("--epochs", type=int, default=None, help="override n_epochs")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    config = Config.from_file(args.param_file).replace(seed=args.seed)
    if args.epochs is not None:
        config = config.replace(n_epochs=args.epochs)
    # The same step for both runs: the reference step, which a network with context takes anyway.
    backend.Backend.runs_reference = lambda self, net, *, reference: True  # type: ignore[method-assign]
    for context in (False, True):
        start = time.perf_counter()
        model = GRU4Rec(config.replace(click_context=context), device="cpu", threads=args.threads)
        model.fit(args.data / "train_full.tsv", progress=False)
        result = evaluate(model, args.data / "test.tsv", cutoffs=(20,), mode="conservative")
        print(json.dumps({"click_context": context, "epochs": config.n_epochs, "seed": args.seed,
                          "recall@20": round(result.recall[20], 4), "mrr@20": round(result.mrr[20], 4),
                          "predictions": result.n_predictions, "seconds": round(time.perf_counter() - start, 1)}),
              flush=True)


if __name__ == "__main__":
    main()
