"""One click of GRU4Rec as an ONNX graph, for ONNX Runtime, NVIDIA Triton or any ONNX serving stack.

The graph is the network's step with the state passed in and out, so the server keeps each
session's hidden states between clicks (zeros start a session)::

    inputs   items        int64   [batch]          item indices (the sidecar's item_ids give index -> id)
             context      float32 [batch, 5]       only for a model with click context: the clicks'
                                                   features (gru4rec.items.context_of)
             hidden_<i>   float32 [batch, L_i]     layer i's state before the click
    outputs  scores       float32 [batch, N]       raw scores of every item: out·Wyᵀ + By
             (or, with top_k = K: top_indices int64 [batch, K] and top_scores float32 [batch, K],
              best first)
             hidden_out_<i> float32 [batch, L_i]   layer i's state after the click

The batch axis is dynamic. A JSON sidecar (``<file>.json``) holds the item ids in index order,
the layer sizes, the input and output names and the opset, so a client needs nothing else.

A model with **click context** (docs/attributes.md, "Click context") takes each click's five
context features as one more input, ``context``, right after ``items`` (the states stay the last
inputs, as in every graph) and steps as ``GRU4RecNet.step(items, hidden, context)``; its
sidecar's ``click_context`` names the features, their formulas from the click's unix time and
the session's previous click's, and the package function that computes them
(:func:`gru4rec.items.context_of`). A plain model's graph has no such input.

A model with **item attributes** (docs/attributes.md) is exported as the plain network of its
catalogue (:func:`~gru4rec.export.common.as_plain_network`): N is then the training items plus
the cold items of its attribute table, the output table holds every item's composed row (a
constant of the graph, composed once at export) and the biases the composed ones, and a cold item is a
valid input (its composed input row, from its attributes alone): ONNX Runtime ranks the cold
items as the PyTorch model does. The sidecar's ``item_ids`` are the catalogue's, cold items last.

The graph is traced by ``torch.onnx.export(dynamo=True)``, the torch.export-based exporter that
is PyTorch's default since 2.9 (the TorchScript one is deprecated); it needs ``onnxscript``.
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from gru4rec.errors import Gru4RecError
from gru4rec.export.common import as_plain_network, check_target, fitted, write_atomically
from gru4rec.inference.protocol import catalogue_of
from gru4rec.items.context import CONTEXT_FEATURES, N_CONTEXT
from gru4rec.network.gru import GRU4RecNet

if TYPE_CHECKING:
    from gru4rec.recommender import GRU4Rec

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "ONNX_HINT", "OneClickStep", "OnnxExport", "export_onnx", "sidecar_path"]

log = logging.getLogger(__name__)

#: The opset written by default (ONNX Runtime >= 1.14 and Triton's onnxruntime backend run it).
DEFAULT_OPSET = 18
#: The lowest opset the torch.export-based exporter writes.
MIN_OPSET = 18
ONNX_HINT = "ONNX export needs onnx and onnxscript: pip install 'gru4rec[export]'"
#: A protobuf message, hence a single .onnx file, holds at most 2 GiB.
_MAX_ONNX_BYTES = 2**31 - 2**24
_SIDECAR_FORMAT = "gru4rec-onnx-step"


class OneClickStep(nn.Module):
    """The network's step as a pure function: ``(items, *hidden) -> (scores, *new_hidden)``, or
    ``(top_indices, top_scores, *new_hidden)`` with ``top_k``. Inference only (no dropout).
    A network with click context takes its clicks' context (B×5) second:
    ``(items, context, *hidden)``.

    A network with item attributes is stepped as the plain network of its catalogue
    (:func:`~gru4rec.export.common.as_plain_network` of a copy: ``net`` is not changed)."""

    def __init__(self, net: GRU4RecNet, top_k: int | None = None) -> None:
        super().__init__()
        if net.attributes is not None:
            net = as_plain_network(copy.deepcopy(net))
        if top_k is not None and not 1 <= top_k <= net.n_items:
            raise Gru4RecError(f"top_k must be between 1 and the number of items ({net.n_items}), got {top_k}")
        self.net = net
        self.top_k = top_k

    def forward(self, items: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
        # One varargs for context and states alike: torch.export then traces a plain network's
        # graph exactly as before the context existed (same signature, same input names).
        context, hidden = (inputs[0], inputs[1:]) if self.net.uses_context else (None, inputs)
        x = self.net.input_table.index_select(0, items)
        outs = self.net.run_layers(x, list(hidden), context=context)
        scores = self.net.score_all(outs[-1])
        if self.top_k is None:
            return (scores, *outs)
        top = torch.topk(scores, self.top_k, dim=1)
        return (top.indices, top.values, *outs)


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote: the graph, its sidecar, and the sidecar's content."""

    path: Path
    sidecar: Path
    description: dict[str, Any]
    seconds: float


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar that goes with an ONNX file: ``step.onnx`` -> ``step.onnx.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def _names(n_layers: int, top_k: int | None, context: bool = False) -> tuple[list[str], list[str]]:
    inputs = ["items"] + (["context"] if context else []) + [f"hidden_{i}" for i in range(n_layers)]
    first = ["scores"] if top_k is None else ["top_indices", "top_scores"]
    return inputs, first + [f"hidden_out_{i}" for i in range(n_layers)]


#: How a client computes the ``context`` input, for the sidecar of a model with click context:
#: :func:`gru4rec.items.context_of`'s formulas written out, as expressions a client in any
#: language can transcribe (``mod``: the remainder, non-negative; ``floor``, ``log``: natural).
_CONTEXT_SPEC: dict[str, Any] = {
    "input": "context",
    "features": list(CONTEXT_FEATURES),
    "function": "gru4rec.items.context_of(times, previous)",
    "time": "t: the click's unix time in seconds, UTC (the unit of the training events' time column); "
            "t_previous: the time of the session's previous click",
    "definitions": {"h": "(t mod 86400) / 3600", "d": "(floor(t / 86400) + 3) mod 7"},
    "meaning": "h: the hour of day in UTC, fractional (06:30 is 6.5); d: the day of week in UTC, Monday = 0",
    "formulas": {
        "hour_sin": "sin(2 * pi * h / 24)",
        "hour_cos": "cos(2 * pi * h / 24)",
        "dow_sin": "sin(2 * pi * d / 7)",
        "dow_cos": "cos(2 * pi * d / 7)",
        "log_gap": "log(1 + t - t_previous)",
    },
    "first_click": "log_gap = 0 at a session's first click (no previous click: previous=None or NaN in context_of)",
    "order": "a session's clicks in time order (t >= t_previous); gru4rec serve counts a click stamped before the "
             "previous one (two replicas' clocks) as a gap of 0, context_of refuses it",
}


def _description(model: GRU4Rec, net: GRU4RecNet, path: Path, top_k: int | None, opset: int) -> dict[str, Any]:
    from gru4rec import __version__

    uses_context = net.uses_context
    inputs, outputs = _names(len(net.sizes), top_k, uses_context)
    hidden_inputs = inputs[len(inputs) - len(net.sizes):]
    n, sizes = net.n_items, net.sizes
    first: list[dict[str, Any]] = (
        [{"name": "scores", "dtype": "float32", "shape": ["batch", n]}] if top_k is None else
        [{"name": "top_indices", "dtype": "int64", "shape": ["batch", top_k]},
         {"name": "top_scores", "dtype": "float32", "shape": ["batch", top_k]}]
    )
    catalogue = catalogue_of(model)
    attributes = fitted(model)[0].attributes
    cold = {} if attributes is None else {"n_cold_items": attributes.n_items - attributes.n_warm}
    # A plain model's sidecar stays as it was: the context's keys only where the graph has the input.
    context_input = ([{"name": "context", "dtype": "float32", "shape": ["batch", N_CONTEXT], "features": list(CONTEXT_FEATURES)}]
                     if uses_context else [])
    context = {"click_context": _CONTEXT_SPEC} if uses_context else {}
    return {
        "format": _SIDECAR_FORMAT,
        "version": 1,
        "model": path.name,
        "what": "one click of GRU4Rec: the item clicked" + (", its click context" if uses_context else "")
                + " and each layer's state in, the scores of every item (or the top_k) and each "
                "layer's new state out; zeros start a session",
        "opset": opset,
        "exporter": f"torch.onnx.export(dynamo=True), torch {torch.__version__}",
        "gru4rec_version": __version__,
        "n_items": n,
        **cold,
        "layers": sizes,
        "embedding_mode": net.mode,
        "hidden_activation": model.config.hidden_act,
        "top_k": top_k,
        "inputs": [{"name": "items", "dtype": "int64", "shape": ["batch"]}] + context_input
                  + [{"name": name, "dtype": "float32", "shape": ["batch", s]} for name, s in zip(hidden_inputs, sizes)],
        "outputs": first + [{"name": name, "dtype": "float32", "shape": ["batch", s]}
                            for name, s in zip(outputs[len(first):], sizes)],
        "hidden_inputs": hidden_inputs,
        "hidden_outputs": outputs[len(first):],
        **context,
        "item_ids": catalogue.to_list(),
    }


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter warns about things that do not concern a user of this graph (torchvision
    absent, its own deprecations, axis renaming); keep them off the console."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _trace(step: OneClickStep, n_layers: int, top_k: int | None, opset: int) -> Any:
    """The ONNX model proto of ``step`` with a dynamic batch axis."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{ONNX_HINT} ({exc})") from exc
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        raise Gru4RecError(f"ONNX export needs torch >= 2.5 (its torch.export-based exporter); this is torch {torch.__version__}")
    uses_context = step.net.uses_context
    inputs, outputs = _names(n_layers, top_k, uses_context)
    # A batch of 2 in the example: torch.export would specialise a batch of 1 to a constant.
    # The context and states are one varargs input to torch.export, hence their dynamic shapes in one tuple.
    context = (torch.zeros(2, N_CONTEXT),) if uses_context else ()
    example = (torch.zeros(2, dtype=torch.int64), *context, *(torch.zeros(2, s) for s in step.net.sizes))
    batch = torch.export.Dim("batch", min=1)
    with _quiet_exporter():
        program = torch.onnx.export(
            step, example, None, dynamo=True, input_names=inputs, output_names=outputs,
            dynamic_shapes=({0: batch}, tuple({0: batch} for _ in range(len(example) - 1))),
            opset_version=opset, verbose=False,
        )
    if program is None:  # only when given a file name, which we never give
        raise Gru4RecError("the ONNX exporter returned no program")
    return program.model_proto


def _check_with_onnxruntime(proto_bytes: bytes, step: OneClickStep) -> float | None:
    """The largest difference between ONNX Runtime's and PyTorch's outputs for a random batch,
    or None when onnxruntime is not installed (it is only needed to serve the graph)."""
    try:
        import onnxruntime as ort
    except ImportError:
        log.debug("onnxruntime not installed: the exported graph was not run")
        return None
    gen = torch.Generator().manual_seed(0)
    items = torch.randint(0, step.net.n_items, (3,), generator=gen)
    hidden = [torch.rand(3, s, generator=gen) * 2 - 1 for s in step.net.sizes]
    # Context in the features' ranges: sin/cos in [-1, 1], log_gap in [0, 12] (up to ~2 days).
    context = ([torch.cat([torch.rand(3, N_CONTEXT - 1, generator=gen) * 2 - 1, torch.rand(3, 1, generator=gen) * 12], dim=1)]
               if step.net.uses_context else [])
    with torch.no_grad():
        want = step(items, *context, *hidden)
    session = ort.InferenceSession(proto_bytes, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, [items.numpy(), *(c.numpy() for c in context), *(h.numpy() for h in hidden)])))
    if step.top_k is not None:
        # Items with equal scores (two cold items with the same attributes) may come in either
        # order: check that each index ONNX Runtime returns has the score it returns beside it.
        with torch.no_grad():
            scores = step.net.score_all(want[-1]).numpy()
        got = [np.take_along_axis(scores, got[0], axis=1), *got[1:]]
        want = (want[1], *want[1:])
    diffs = [float(np.abs(g.astype(np.float64) - w.numpy().astype(np.float64)).max()) for g, w in zip(got, want)]
    return max(diffs)


def export_onnx(
    model: GRU4Rec,
    path: str | os.PathLike[str],
    *,
    top_k: int | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
) -> OnnxExport:
    """Write the one-click step of ``model`` to ``path`` (ONNX) and its sidecar ``path + '.json'``.

    Both files are written atomically; neither replaces an existing file unless ``overwrite``;
    when the sidecar cannot be written, a graph this call created is removed again.
    When onnxruntime is installed the graph is run once against PyTorch before it is written.

    Raises:
        Gru4RecError: a bad target (a directory, an existing file, a missing folder), a bad
            ``top_k`` or ``opset``, a model too large for one ONNX file, or a graph that does
            not reproduce PyTorch's outputs.
        ImportError: onnx or onnxscript is not installed (the message says how to install them).
    """
    path, sidecar = Path(path), sidecar_path(path)
    check_target(path, "ONNX file", overwrite=overwrite)
    check_target(sidecar, "ONNX sidecar", overwrite=overwrite)
    if not isinstance(opset, int) or opset < MIN_OPSET:
        raise Gru4RecError(f"opset must be an integer >= {MIN_OPSET} (the torch.onnx exporter's lowest), got {opset!r}")
    # The graph is traced from a float32 CPU copy, so the caller's model stays where it is; with
    # item attributes, the copy becomes the plain network of the catalogue (composed rows).
    net = as_plain_network(copy.deepcopy(fitted(model)[0]).to("cpu", torch.float32).eval())
    weight_bytes = sum(p.numel() * 4 for p in net.parameters())
    if weight_bytes > _MAX_ONNX_BYTES:
        raise Gru4RecError(
            f"the model's weights are {weight_bytes / 2**30:.1f} GiB; one ONNX file holds at most 2 GiB"
        )
    step = OneClickStep(net, top_k)
    start = time.perf_counter()
    proto = _trace(step, len(net.sizes), top_k, opset)
    data = proto.SerializeToString()
    diff = _check_with_onnxruntime(data, step)
    if diff is not None:
        log.debug("ONNX Runtime vs PyTorch on a random batch: max |difference| %.2e", diff)
        if diff > 1e-4:
            raise Gru4RecError(f"the exported graph does not reproduce the model (max |difference| {diff:.2e})")
    description = _description(model, net, path, top_k, opset)
    existed = path.exists()
    write_atomically(path, lambda tmp: tmp.write_bytes(data), what="ONNX file", overwrite=overwrite)
    try:
        write_atomically(sidecar, lambda tmp: tmp.write_text(json.dumps(description, indent=1) + "\n", encoding="utf-8"),
                         what="ONNX sidecar", overwrite=overwrite)
    except Exception:
        if not existed:  # a graph without its sidecar is half an export: take back what we made
            path.unlink(missing_ok=True)
        raise
    seconds = time.perf_counter() - start
    log.info("Wrote %s (%s bytes, opset %d%s) and %s in %.1fs", path, f"{len(data):,}", opset,
             f", top {top_k}" if top_k else "", sidecar, seconds)
    return OnnxExport(path, sidecar, description, seconds)
