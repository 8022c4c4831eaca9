"""The model side of one serving batch, in-process: ``Engine.run`` with int8 candidates and exact
rescoring against the float32 product, at several batch sizes (alternating, medians), and the
time of one read of the float32 item matrix (the floor of any float32 scoring of one click).

    python -m benchmarks.serve.serve_engine --model model.pt [--batches 1 8 32 64] [--rounds 5]
    python -m benchmarks.serve.serve_engine --model attributes.safetensors --compare plain.safetensors

A model without an int8 output layer (one with item attributes) runs float32 only. ``--compare``
runs a second model's float32 engine in the same rounds, on the same clicks: its ms, and the
clicks/s of ``--model`` over it (e.g. attributes against plain, issue 49: ≥ 0.8).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gru4rec import GRU4Rec
from gru4rec.inference import Engine, Work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compare", type=Path, help="a second model whose float32 engine runs alternately")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = GRU4Rec.load(args.model, device="cpu")
    engines = {"float32": Engine(model, scoring="float32")}
    if model.output_layer() is not None:
        engines = {"int8": Engine(model, scoring="int8", int8_max_batch=max(args.batches)), **engines}
    if args.compare is not None:
        engines["compare"] = Engine(GRU4Rec.load(args.compare, device="cpu"), scoring="float32")
    n_items = min(e.n_items for e in engines.values())  # clicks on items every model knows
    rng = np.random.default_rng(0)
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for b in args.batches:
            works = [Work(None, rng.integers(0, n_items, 1), 20) for _ in range(b)]
            for name, engine in engines.items():
                engine.run(works)  # warm
                start = time.perf_counter()
                engine.run(works)
                times.setdefault((b, name), []).append(time.perf_counter() - start)
    for b in args.batches:
        ms = {n: float(np.median(times[(b, n)])) * 1e3 for n in engines}
        line: dict[str, object] = {"rows": b, **{f"{n}_ms": round(v, 2) for n, v in ms.items()}}
        if "int8" in ms:
            line["float32_over_int8"] = round(ms["float32"] / ms["int8"], 2)
        if "compare" in ms:
            line["clicks_per_s_over_compare"] = round(ms["compare"] / ms["float32"], 3)
        print(json.dumps(line))
    if "int8" in engines:
        print(json.dumps({"certified_rows": engines["int8"].topk.counts}))
    wy = model.net.Wy.detach()
    reads = []
    for _ in range(20):
        start = time.perf_counter()
        wy.sum()
        reads.append(time.perf_counter() - start)
    print(json.dumps({"read_item_matrix_ms_fastest": round(min(reads) * 1e3, 2), "bytes": wy.numel() * 4}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
