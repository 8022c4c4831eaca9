"""Sizes and times of the model file formats and the exports, and the latency of one click in
ONNX Runtime against PyTorch on the CPU.

Usage (from the repository root; the data set lives beside the project in ../shared/data):

    OMP_NUM_THREADS=1 python -m benchmarks.pipeline.export_speed                       # diginetica, 1 thread
    python -m benchmarks.pipeline.export_speed --threads 2 --clicks 2000 --repeats 7

The model is a randomly initialised network of the DIGINETICA configuration (512 units, shared
embedding) over the training file's items — the work per click, the file sizes and the export
times do not depend on the weights' values. Without the data set it uses 43,097 synthetic item
ids (DIGINETICA's count). Prints one JSON line per measurement:

* ``file``: bytes of the model file in format 1 (the ``torch.save`` envelope of gru4rec 0.1,
  rebuilt here as that release wrote it) and format 2 (safetensors), with save and load times
  (medians of ``--repeats``);
* ``export``: seconds and bytes of the ONNX graph (all scores; top 20), the item embeddings
  (.parquet, .npy) and the session embeddings of the test file;
* ``click``: the latency of one click — the step plus the scores of every item, or the top 20 —
  at batch 1 and 32: the median over ``--clicks`` runs per round, rounds alternating between
  ONNX Runtime and PyTorch (``torch.inference_mode``, the same arithmetic as the graph), both
  on ``--threads`` threads; ``ratio`` = PyTorch / ONNX Runtime (> 1: ONNX Runtime is faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "diginetica_srgnn"
CONFIG = ROOT / "paramfiles" / "diginetica_bprmax_shared_512_best.json"
DIGINETICA_ITEMS = 43_097


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_model(data: Path | None) -> Any:
    """A GRU4Rec of the DIGINETICA configuration with random weights over the data's items."""
    import pandas as pd

    from gru4rec import GRU4Rec
    from gru4rec.config import Config
    from gru4rec.data import ItemMap
    from gru4rec.network.gru import GRU4RecNet

    model = GRU4Rec(Config.from_file(CONFIG), device="cpu")
    if data is not None and (data / "train_full.tsv").exists():
        events = pd.read_csv(data / "train_full.tsv", sep="\t", usecols=["ItemId"])
        model.item_map = ItemMap.from_ids(events["ItemId"])
        model.item_support = events["ItemId"].value_counts().reindex(model.item_map.ids).to_numpy(np.int64, copy=True)
    else:
        model.item_map = ItemMap.from_ids(np.arange(DIGINETICA_ITEMS) * 7 + 1000)
        model.item_support = np.ones(DIGINETICA_ITEMS, np.int64)
    model.net = GRU4RecNet(len(model.item_map), model.config, generator=torch.Generator().manual_seed(0)).eval()
    return model


def save_format_1(model: Any, path: Path) -> None:
    """The file gru4rec 0.1 wrote (its envelope, rebuilt; no current code writes it)."""
    tensors = {k: v.detach().contiguous().clone() for k, v in model.net.state_dict().items()}
    tensors["item_support"] = torch.from_numpy(np.array(model.item_support, dtype=np.int64))
    meta = {"kind": "gru4rec-model", "config": model.config.to_dict(), "item_ids": model.item_map.to_list(), "epochs_trained": 0}
    meta_json = json.dumps(meta, ensure_ascii=False)
    crc = {n: zlib.crc32(t.reshape(-1).view(torch.uint8).numpy()) for n, t in tensors.items()}
    envelope = {"format": "gru4rec", "version": 1, "writer": "0.1.0", "meta_json": meta_json,
                "meta_crc32": zlib.crc32(meta_json.encode()), "tensors": tensors, "crc32": crc}
    torch.save(envelope, path)


def file_formats(model: Any, folder: Path, repeats: int) -> None:
    from gru4rec import GRU4Rec

    v1, v2 = folder / "model_v1.pt", folder / "model_v2.safetensors"
    save_v1 = median_seconds(lambda: save_format_1(model, v1), repeats)
    save_v2 = median_seconds(lambda: model.save(v2, overwrite=True), repeats)
    load_v1 = median_seconds(lambda: GRU4Rec.load(v1, device="cpu"), repeats)
    load_v2 = median_seconds(lambda: GRU4Rec.load(v2, device="cpu"), repeats)
    emit("file", format=1, bytes=v1.stat().st_size, save_s=round(save_v1, 3), load_s=round(load_v1, 3))
    emit("file", format=2, bytes=v2.stat().st_size, save_s=round(save_v2, 3), load_s=round(load_v2, 3))


def exports(model: Any, folder: Path, data: Path | None) -> dict[str, Path]:
    from gru4rec.export import export_onnx, item_embeddings, session_embeddings, write_table

    graphs = {}
    for top_k in (None, 20):
        path = folder / f"step_{top_k or 'all'}.onnx"
        result = export_onnx(model, path, top_k=top_k, overwrite=True)
        emit("export", what="onnx", top_k=top_k, seconds=round(result.seconds, 2), bytes=path.stat().st_size)
        graphs[str(top_k)] = path
    for suffix in (".parquet", ".npy"):
        path = folder / f"items{suffix}"
        start = time.perf_counter()
        write_table(path, *item_embeddings(model), overwrite=True)
        emit("export", what="item_embeddings", format=suffix, seconds=round(time.perf_counter() - start, 2),
             bytes=path.stat().st_size)
    test = data / "test.tsv" if data is not None else None
    if test is not None and test.exists() and (data / "train_full.tsv").exists():
        path = folder / "sessions.parquet"
        start = time.perf_counter()
        columns, description = session_embeddings(model, test)
        write_table(path, columns, description, overwrite=True)
        emit("export", what="session_embeddings", sessions=len(columns["session_id"]),
             seconds=round(time.perf_counter() - start, 2), bytes=path.stat().st_size)
    return graphs


def click_latency(model: Any, graphs: dict[str, Path], threads: int, clicks: int, repeats: int) -> None:
    import onnxruntime as ort

    from gru4rec.export.onnx import OneClickStep

    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    n = len(model.item_map)
    for top_k in (None, 20):
        session = ort.InferenceSession(str(graphs[str(top_k)]), options, providers=["CPUExecutionProvider"])
        step = OneClickStep(model.net, top_k).eval()
        for batch in (1, 32):
            rng = np.random.default_rng(batch)
            items = rng.integers(0, n, batch).astype(np.int64)
            hidden = [rng.uniform(-1, 1, (batch, size)).astype(np.float32) for size in model.net.sizes]
            feed = {"items": items, **{f"hidden_{i}": h for i, h in enumerate(hidden)}}
            t_items, t_hidden = torch.from_numpy(items), [torch.from_numpy(h) for h in hidden]

            def run_ort(session: Any = session, feed: dict[str, np.ndarray] = feed) -> None:
                session.run(None, feed)

            def run_torch(step: Any = step, t_items: torch.Tensor = t_items, t_hidden: list[torch.Tensor] = t_hidden) -> None:
                with torch.inference_mode():
                    step(t_items, *t_hidden)

            for fn in (run_ort, run_torch):  # warm-up: first runs allocate and pick kernels
                for _ in range(20):
                    fn()
            per_round: dict[str, list[float]] = {"onnxruntime": [], "pytorch": []}
            for _ in range(repeats):
                for name, fn in (("onnxruntime", run_ort), ("pytorch", run_torch)):
                    times = []
                    for _ in range(clicks):
                        start = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - start)
                    per_round[name].append(statistics.median(times))
            ort_ms = statistics.median(per_round["onnxruntime"]) * 1e3
            torch_ms = statistics.median(per_round["pytorch"]) * 1e3
            emit("click", top_k=top_k, batch=batch, threads=threads, onnxruntime_ms=round(ort_ms, 4),
                 pytorch_ms=round(torch_ms, 4), ratio=round(torch_ms / ort_ms, 2),
                 rounds_onnxruntime_ms=[round(t * 1e3, 4) for t in per_round["onnxruntime"]],
                 rounds_pytorch_ms=[round(t * 1e3, 4) for t in per_round["pytorch"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with train_full.tsv and test.tsv")
    parser.add_argument("--threads", type=int, default=1, help="threads of PyTorch and of ONNX Runtime (default: 1)")
    parser.add_argument("--clicks", type=int, default=1000, help="timed clicks per round (default: 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per measurement (default: 5)")
    parser.add_argument("--skip-files", action="store_true", help="only the exports and the click latency")
    args = parser.parse_args(argv)
    import logging

    from gru4rec.log import set_verbosity

    set_verbosity(logging.WARNING)  # stdout carries the JSON lines only
    torch.set_num_threads(args.threads)
    data = args.data if args.data.exists() else None
    model = build_model(data)
    emit("model", n_items=len(model.item_map), layers=model.net.sizes, data=str(data) if data else "synthetic ids",
         torch=torch.__version__, threads=args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.skip_files:
            file_formats(model, folder, args.repeats)
        graphs = exports(model, folder, data)
        click_latency(model, graphs, args.threads, args.clicks, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
