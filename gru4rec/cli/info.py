"""``gru4rec info``: what a model file (or training checkpoint) holds, as text or JSON; or, for
an event file, its size and how often its next items repeat the session (with what that means
for the choice of model), and with ``--train`` how much of it is in the training data."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from gru4rec.cli.common import EXIT_OK, ColumnFlags, add_flags, check_readable, flag
from gru4rec.cli.console import result

__all__ = ["InfoSettings", "REPEAT_HEAVY", "REPEAT_SOME", "add_arguments", "attribute_summary", "count_items", "repeat_advice", "run"]

#: Metadata entries that are large or structured (the item ids, the resume RNG state, the training
#: transitions' hashes, the attributes' vocabularies: :func:`attribute_summary` instead), not for reading.
_NOT_SHOWN = ("config", "item_attributes", "item_ids", "item_map", "item_support", "numpy_rng", "train_transitions")

#: Repeat shares from which the advice changes (docs/results.md, "Repeated targets": Tmall 43 %,
#: rsc15 34-36 %, DIGINETICA 20 %).
REPEAT_HEAVY, REPEAT_SOME = 0.30, 0.10


@dataclass(frozen=True, kw_only=True)
class InfoSettings(ColumnFlags):
    """The settings of ``gru4rec info``: a field per flag, declared with it."""

    file: str = flag(metavar="FILE",
                     help="a model file saved by train --save: its format, items and configuration; or an "
                          "event file (TSV/CSV/Parquet): its sessions and repeated targets")
    json: bool = flag("--json", action="store_true", default=False, help="print the description as JSON")
    train: str | None = flag("--train", metavar="TRAIN", default=None,
                             help="event files only: count as the evaluator does with a model trained on TRAIN "
                                  "(items unknown to TRAIN dropped), and how much of FILE is in TRAIN")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec info`` (:class:`InfoSettings`)."""
    add_flags(parser, InfoSettings)


def repeat_advice(share: float) -> str:
    """What the share of repeated targets means for the choice of model (docs/results.md)."""
    if share >= REPEAT_HEAVY:
        return ("repeat-heavy: much of a test is won by the session's own items. The session-popularity "
                "baseline (gru4rec baseline spop TRAIN -t TEST) is the bar to clear, and repeat-aware "
                "scoring (gru4rec evaluate MODEL -t TEST --fit-repeat VALID) is worth choosing on validation")
    if share >= REPEAT_SOME:
        return ("some repeats: repeat-aware scoring may add a little (choose it with gru4rec evaluate MODEL "
                "-t TEST --fit-repeat VALID); compare with gru4rec baseline spop")
    return "few repeats: the next item is mostly new to the session; repeat-aware scoring has little to win"


def _event_info(args: InfoSettings) -> int:
    """``gru4rec info DATA``: events, sessions, items, repeated targets (and the overlap with --train)."""
    from gru4rec.data import ItemMap, read_events, sessions_from_events
    from gru4rec.data.overlap import TrainingFingerprint, paired_sessions
    from gru4rec.evaluation.repeats import repeat_shares

    check_readable(None if args.train is None else [args.train], "training file")
    keys = {"session_key": args.session_key or "SessionId", "item_key": args.item_key or "ItemId",
            "time_key": args.time_key or "Time"}
    events = read_events(args.file, **keys)
    train = None if args.train is None else read_events(args.train, **keys)
    if train is None:
        sessions, n_dropped = sessions_from_events(events, ItemMap.from_ids(events[keys["item_key"]]), order="id",
                                                   session_key=keys["session_key"], item_key=keys["item_key"],
                                                   time_key=keys["time_key"])
    else:
        train_sessions, sessions, n_dropped = paired_sessions(train, events, **keys)
    repeats = repeat_shares(sessions)
    summary: dict[str, Any] = {
        "file": args.file, "events": len(events), "sessions": int(events[keys["session_key"]].nunique()),
        "items": int(events[keys["item_key"]].nunique()), "train": args.train,
        "events_with_unknown_items": n_dropped if train is not None else None,
        "targets": repeats.n_targets, "repeat_share": repeats.share, "immediate_repeat_share": repeats.immediate_share,
        "advice": repeat_advice(repeats.share),
    }
    if train is not None:
        summary["in_train_share"] = TrainingFingerprint.of(train_sessions).overlap(sessions).share
    if args.json:
        result(json.dumps(summary, indent=2))
        return EXIT_OK
    result(f"file: {args.file}")
    result(f"events: {summary['events']:,} in {summary['sessions']:,} sessions, {summary['items']:,} items")
    if train is not None:
        result(f"items unknown to {args.train}: {n_dropped:,} events dropped, as the evaluator drops them")
    result(f"prediction targets: {repeats.n_targets:,} (every event but a session's first)")
    result(f"repeated targets: {repeats.share:.1%} (the item is already in the session); "
           f"the previous item again: {repeats.immediate_share:.1%}")
    if train is not None:
        result(f"in the training data: {summary['in_train_share']:.1%} of the targets "
               f"(session id, previous item -> item; above 1 % the figures measure memory)")
    result(f"advice: {summary['advice']}")
    return EXIT_OK


def attribute_summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What a model trained with item attributes holds of them (None for a plain model): its
    columns with their kind and vocabulary size (codes, the unknown value included), and its
    cold items."""
    attrs = meta.get("item_attributes")
    if not isinstance(attrs, dict):
        return None
    encoding = attrs.get("encoding", {})
    columns = {e["name"]: {"kind": "multi" if e["multi"] else "categorical", "codes": len(e["vocabulary"]) + 1}
               for e in encoding.get("categorical", [])}
    columns.update({e["name"]: {"kind": "numeric"} for e in encoding.get("numeric", [])})
    return {"item_key": encoding.get("item_key"), "columns": columns, "cold_items": len(attrs.get("cold_item_ids", []))}


def count_items(meta: dict[str, Any], tensors: dict[str, Any]) -> int | None:
    """The item count of a model file (item id list) or a training checkpoint (its data summary)."""
    for key in ("item_ids", "item_map"):
        if isinstance(meta.get(key), list):
            return len(meta[key])
    if "item_support" in tensors:
        return int(tensors["item_support"]["shape"][0])
    data = meta.get("data")
    if isinstance(data, dict) and isinstance(data.get("n_items"), int):
        return int(data["n_items"])
    return None


def run(args: InfoSettings) -> int:
    """Run ``gru4rec info``: a model file's format, item count, configuration and tensors; an
    event file's repeated targets."""
    from gru4rec.data.events import is_event_file_name
    from gru4rec.errors import Gru4RecError, ModelFileError
    from gru4rec.formats.checkpoint import file_info

    try:
        info = file_info(args.file)
    except ModelFileError as model_error:
        if not is_event_file_name(args.file):
            raise
        try:
            return _event_info(args)
        except Gru4RecError as data_error:  # neither: say both
            raise Gru4RecError(f"{model_error}; as an event file: {data_error}") from data_error
    if args.train is not None:
        from gru4rec.cli.common import UsageError

        raise UsageError("--train is for event files; a model file holds no events")
    meta = info["meta"]
    config = meta.get("config", {})
    from gru4rec.config import Config
    from gru4rec.errors import ConfigError

    try:  # every parameter: a model file leaves some out at their defaults (model_file.EXTENSION_DEFAULTS)
        config = Config.from_dict(config).to_dict()
    except ConfigError:  # shown as written
        pass
    n_items = count_items(meta, info["tensors"])
    summary = {
        "file": args.file,
        "format_version": info["format_version"],
        "container": info["container"],
        "written_by": info["writer"],
        "size_bytes": info["size_bytes"],
        "n_items": n_items,
        "config": config,
        "tensors": info["tensors"],
    }
    attributes = attribute_summary(meta)
    if attributes is not None:
        summary["item_attributes"] = attributes
    extra = {k: v for k, v in meta.items() if k not in _NOT_SHOWN}
    if extra:
        summary["meta"] = extra
    if args.json:
        result(json.dumps(summary, indent=2))
        return EXIT_OK
    result(f"file: {args.file} ({info['size_bytes']:,} bytes)")
    result(f"format version: {info['format_version']} ({info['container']}, written by gru4rec {info['writer']})")
    result(f"items: {n_items if n_items is not None else 'unknown'}")
    if attributes is not None:
        cols = ", ".join(f"{name} ({c['kind']}{', ' + str(c['codes']) + ' codes' if 'codes' in c else ''})"
                         for name, c in attributes["columns"].items())
        result(f"item attributes: {cols}; {attributes['cold_items']:,} cold items")
    if config.get("click_context"):
        from gru4rec.items.context import CONTEXT_FEATURES

        result(f"click context: {', '.join(CONTEXT_FEATURES)} (Wc)")
    for key, value in extra.items():
        result(f"{key}: {json.dumps(value)}")
    result("config:")
    for key, value in config.items():
        result(f"  {key} = {value if isinstance(value, str) else json.dumps(value)}")
    result("tensors:")
    for name, t in info["tensors"].items():
        result(f"  {name}: {t['dtype']} {'x'.join(map(str, t['shape'])) or 'scalar'}")
    return EXIT_OK
