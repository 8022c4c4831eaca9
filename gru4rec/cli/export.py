"""``gru4rec export``: a model's one-click step as ONNX, its item and session vectors as files."""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from gru4rec.cli.common import (
    DEVICE_FLAG,
    EXIT_OK,
    FORCE_FLAG,
    ColumnFlags,
    UsageError,
    add_flags,
    check_readable,
    column_flags,
    declared_flag,
    flag,
    flag_field,
    load_model,
    positive_int,
)
from gru4rec.errors import Gru4RecError

__all__ = ["DESCRIPTION", "FLAGS", "ExportSettings", "add_arguments", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Take a trained model elsewhere; give one or more of the exports.\n\n"
    "  --onnx STEP.onnx            one click as an ONNX graph (item indices, the clicks'\n"
    "                              context for a model with click_context, and each layer's\n"
    "                              state in; scores of all items, or the top K with --top-k,\n"
    "                              and the new states out; dynamic batch size), plus\n"
    "                              STEP.onnx.json with the item ids and layer sizes\n"
    "  --item-embeddings FILE      item_id, output (Wy row), bias (By) and, for a separate\n"
    "                              or one-hot input, input; .parquet or .npy\n"
    "  --session-embeddings TEST FILE\n"
    "                              session_id, embedding (the final hidden state after the\n"
    "                              session's known clicks), n_events; .parquet or .npy\n\n"
    "score(item i | session) = embedding · output_i + bias_i. A model with item\n"
    "attributes exports its cold items too: output and bias are an item's composed\n"
    "row and bias (docs/attributes.md). Existing files are kept unless --force."
)


_ONNX = "ONNX"
_EMBEDDINGS = "embeddings"
#: The column flags' help: their default is the model's.
FLAGS = column_flags("the model's")


@dataclass(frozen=True, kw_only=True)
class ExportSettings(ColumnFlags):
    """The settings of ``gru4rec export``: a field per flag, declared with it."""

    model: str = flag(metavar="MODEL", help="a model file saved by train --save")
    onnx: str | None = flag("--onnx", metavar="STEP.onnx", group=_ONNX, default=None,
                            help="write the one-click step as ONNX (and STEP.onnx.json beside it)")
    top_k: int | None = flag("--top-k", metavar="K", type=positive_int, group=_ONNX, default=None,
                             help="the graph returns the top K item indices and scores instead of all scores")
    # Its default lives with the exporter (imported only when the command runs): see add_arguments.
    opset: int = flag("--opset", metavar="N", type=positive_int, group=_ONNX, help="ONNX opset")
    item_embeddings: str | None = flag("--item-embeddings", metavar="FILE", group=_EMBEDDINGS, default=None,
                                       help="write every item's vectors to FILE (.parquet or .npy)")
    #: (TEST_FILE, FILE)
    session_embeddings: list[str] | None = flag("--session-embeddings", metavar=("TEST_FILE", "FILE"), nargs=2,
                                                group=_EMBEDDINGS, default=None,
                                                help="write the final hidden state of every session of TEST_FILE to "
                                                     "FILE (.parquet or .npy)")
    device: str = flag_field(DEVICE_FLAG, "auto")
    force: bool = flag_field(FORCE_FLAG, False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec export`` (:class:`ExportSettings`; ``--opset``'s default is the exporter's)."""
    from gru4rec.export.onnx import DEFAULT_OPSET, MIN_OPSET

    opset = declared_flag(ExportSettings, "opset", default=DEFAULT_OPSET,
                          help=f"ONNX opset, at least {MIN_OPSET} (default: {DEFAULT_OPSET})")
    add_flags(parser, ExportSettings, {**FLAGS, "opset": opset})


def _targets(args: ExportSettings) -> list[tuple[Path, str]]:
    """Every file the command will write, with what it is; usage errors before any work."""
    from gru4rec.export.onnx import sidecar_path
    from gru4rec.export.tables import table_format

    if not (args.onnx or args.item_embeddings or args.session_embeddings):
        raise UsageError("nothing to export: give --onnx, --item-embeddings and/or --session-embeddings")
    if args.onnx is None and args.top_k is not None:
        raise UsageError("--top-k applies to --onnx only")
    targets: list[tuple[Path, str]] = []
    if args.onnx:
        if Path(args.onnx).suffix.lower() != ".onnx":
            raise UsageError(f"ONNX file {args.onnx}: unknown extension; use .onnx")
        targets += [(Path(args.onnx), "ONNX file"), (sidecar_path(args.onnx), "ONNX sidecar")]
    try:
        if args.item_embeddings:
            table_format(args.item_embeddings, "item embeddings file")
            targets.append((Path(args.item_embeddings), "item embeddings file"))
        if args.session_embeddings:
            table_format(args.session_embeddings[1], "session embeddings file")
            targets.append((Path(args.session_embeddings[1]), "session embeddings file"))
    except Gru4RecError as exc:
        raise UsageError(str(exc)) from None
    resolved = [p.resolve() for p, _ in targets]
    if len(set(resolved)) != len(resolved):
        raise UsageError("two exports would write the same file; give each its own name")
    if args.session_embeddings and Path(args.session_embeddings[0]).resolve() in resolved:
        raise UsageError(f"the session embeddings would overwrite their own test file {args.session_embeddings[0]}")
    return targets


def run(args: ExportSettings) -> int:
    """Run ``gru4rec export``: check every target, load the model once, write each export."""
    from gru4rec.export import export_onnx, item_embeddings, session_embeddings, write_table
    from gru4rec.export.common import check_target

    targets = _targets(args)
    check_readable([args.model], "model file")
    if args.session_embeddings:
        check_readable([args.session_embeddings[0]], "test file")
    for path, what in targets:  # fail before any work, not after the first export
        check_target(path, what, overwrite=args.force)
    model = load_model(args.model, args.device)
    if args.onnx:
        export_onnx(model, args.onnx, top_k=args.top_k, opset=args.opset, overwrite=args.force)
    if args.item_embeddings:
        columns, description = item_embeddings(model)
        write_table(args.item_embeddings, columns, description, what="item embeddings file", overwrite=args.force)
        log.info("Wrote %d items (%s) to %s", len(columns["item_id"]), ", ".join(columns), args.item_embeddings)
    if args.session_embeddings:
        test, out = args.session_embeddings
        columns, description = session_embeddings(model, test, session_key=args.session_key,
                                                  item_key=args.item_key, time_key=args.time_key)
        write_table(out, columns, description, what="session embeddings file", overwrite=args.force)
        log.info("Wrote %d session embeddings (%d wide) to %s", len(columns["session_id"]),
                 columns["embedding"].shape[1], out)
    return EXIT_OK
