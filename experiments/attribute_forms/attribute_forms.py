"""Where an item's attributes go: summed into its row (what gru4rec does) or concatenated beside
its id row (issue 49's alternative), measured on a benchmark with a known optimum.

    python -m gru4rec synth .bench/iattr --kind intents-attributes
    python -m experiments.attribute_forms.attribute_forms --data .bench/iattr \\
        -pf paramfiles/synthetic_intents_best.py -ps dropout_p_id=0.25 --forms sum concat

(the generator writes the category as a number: ``--item-types category=categorical``, the
default here, says what it is).

**sum** (the package's form, docs/attributes.md): row(i) = id(i) + attr(i), every one of the L
columns shared by the id row and the attribute part. **concat**: row(i) = [id(i) | attr(i)], the id
row in the first L − d columns and the attribute part in the last d (``--attr-share`` d/L, default
0.5): the score h·row(i) = h₁·id(i) + h₂·attr(i) keeps the two in separate subspaces of the GRU's
output, the form of feature concatenation in the parallel-RNN paper (Hidasi et al., RecSys 2016),
at the same width — so the same network, the same tables, the same steps, differing only in which
columns each part may use. It is run here without a second implementation: the concatenated form is
the summed one with the id rows' last d columns and the attribute tables' first L − d columns held
at zero (zero at the start, their gradients zeroed at every step in the one place both training
steps take them from, :meth:`gru4rec.training.composed.StepComposition.grads` — the bias column
is the attributes' in both forms), which :func:`concatenated` patches in for the duration of a run.

Each form is trained on ``train_full`` with ``items.tsv`` and evaluated on ``test`` (conservative
ties, the whole catalogue: cold items too) and the figures printed beside the optimum's from
``oracle.json``: Recall@20 and MRR@20 on all, warm and cold targets.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.config import Config
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.composed import StepComposition, TableGrads
from gru4rec.training.optim import UniqueGrad

FORMS = ("sum", "concat")


def id_columns(width: int, attr_share: float) -> int:
    """The columns of the id part in the concatenated form (the attributes have the rest)."""
    return max(1, min(width - 1, round(width * (1.0 - attr_share))))


@contextlib.contextmanager
def concatenated(attr_share: float = 0.5) -> Iterator[None]:
    """Within the block, every network with attributes is built and trained in the concatenated
    form: the id rows' last d columns and the attribute tables' (and projection's) first L − d
    row columns are zero, and stay zero (their gradients zeroed where the steps take them)."""
    init, grads = GRU4RecNet.__init__, StepComposition.grads

    def patched_init(self: GRU4RecNet, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        rows = self.attributes
        if rows is None:
            return
        split = id_columns(rows.width, attr_share)
        with torch.no_grad():
            self.Wy[:, split:] = 0.0
            for block in (*rows.tables, *([rows.projection] if rows.projection is not None else [])):
                block[:, :split] = 0.0

    def masked(value: Any, columns: slice) -> Any:
        """A copy of a sparse gradient (UniqueGrad, (rows, grad) or a list of them) with ``columns`` zero."""
        if isinstance(value, list):
            return [masked(v, columns) for v in value]
        rows, grad = value
        grad = grad.clone()
        grad[:, columns] = 0.0
        return UniqueGrad(rows, grad) if isinstance(value, UniqueGrad) else (rows, grad)

    def patched_grads(self: StepComposition, parts: list[Any]) -> tuple[TableGrads, dict[str, torch.Tensor]]:
        sparse, dense = grads(self, parts)
        assert self.net.attributes is not None  # a StepComposition's network has them
        split = id_columns(self.net.attributes.width, attr_share)
        out: TableGrads = {}
        for name, value in sparse.items():
            if name == "Wy":
                out[name] = masked(value, slice(split, None))
            elif name.startswith("attributes."):
                out[name] = masked(value, slice(0, split))
            else:
                out[name] = value
        projections = {}
        for name, g in dense.items():  # the scored rows' projection (attributes.projection)
            if name.startswith("attributes."):
                g = g.clone()
                g[:, :split] = 0.0
            projections[name] = g
        return out, projections

    GRU4RecNet.__init__ = patched_init  # type: ignore[method-assign]
    StepComposition.grads = patched_grads  # type: ignore[method-assign]
    try:
        yield
    finally:
        GRU4RecNet.__init__ = init  # type: ignore[method-assign]
        StepComposition.grads = grads  # type: ignore[method-assign]


def run_form(form: str, data: Path, config: Config, *, attr_share: float, threads: int,
             types: dict[str, str]) -> dict[str, Any]:
    """Train ``form`` on data/train_full.tsv with data/items.tsv; its test figures by target group."""
    model = GRU4Rec(config, device="cpu", threads=threads)
    start = time.perf_counter()
    with concatenated(attr_share) if form == "concat" else contextlib.nullcontext():
        model.fit(data / "train_full.tsv", item_features=data / "items.tsv", attribute_types=types, progress=False)
    seconds = time.perf_counter() - start
    result = evaluate(model, data / "test.tsv", cutoffs=[20], mode="conservative")
    groups = {g.label: g for g in result.target_groups or []}
    return {"form": form, "train_s": seconds,
            **{f"{label}_{metric}": getattr(groups[label], metric)[20] for label in ("all", "warm", "cold")
               for metric in ("recall", "mrr")}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `gru4rec synth --kind intents-attributes` folder")
    parser.add_argument("-pf", "--param-file", required=True)
    parser.add_argument("-ps", "--params", default="", help="overrides, e.g. dropout_p_id=0.2,n_epochs=5")
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument("--attr-share", type=float, default=0.5, help="concat: the attribute part's share of the columns")
    parser.add_argument("--item-types", default="category=categorical", help="column kinds, as gru4rec train takes them")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    types = dict(pair.split("=", 1) for pair in args.item_types.split(",") if pair)
    config = Config.from_file(args.param_file)
    if args.params:
        config = config.replace_from_string(args.params)
    oracle = json.loads((args.data / "oracle.json").read_text())["test"]
    print(f"data {args.data}, {args.param_file} {args.params}, concat attribute share {args.attr_share}")
    print(f"{'form':<8} {'all R@20':>9} {'MRR@20':>8} {'warm R@20':>10} {'MRR@20':>8} {'cold R@20':>10} {'MRR@20':>8}  train s")
    print(f"{'optimum':<8} {oracle['all']['recall@20']:>9.4f} {oracle['all']['mrr@20']:>8.4f} "
          f"{oracle['warm']['recall@20']:>10.4f} {oracle['warm']['mrr@20']:>8.4f} "
          f"{oracle['cold']['recall@20']:>10.4f} {oracle['cold']['mrr@20']:>8.4f}")
    for form in args.forms:
        r = run_form(form, args.data, config, attr_share=args.attr_share, threads=args.threads, types=types)
        print(f"{form:<8} {r['all_recall']:>9.4f} {r['all_mrr']:>8.4f} {r['warm_recall']:>10.4f} {r['warm_mrr']:>8.4f} "
              f"{r['cold_recall']:>10.4f} {r['cold_mrr']:>8.4f}  {r['train_s']:.0f}", flush=True)


if __name__ == "__main__":
    main()
