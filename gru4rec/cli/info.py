"""``gru4rec info``: what a model file (or training checkpoint) holds, as text or JSON."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from gru4rec.cli.common import EXIT_OK
from gru4rec.cli.console import result

__all__ = ["InfoSettings", "add_arguments", "count_items", "run"]

#: Metadata entries that are large or structured (the item ids, the resume RNG state), not for reading.
_NOT_SHOWN = ("config", "item_ids", "item_map", "item_support", "numpy_rng")



@dataclass(frozen=True)
class InfoSettings:
    """The settings of ``gru4rec info`` (one field per flag)."""

    model: str
    json: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec info``."""
    parser.add_argument("model", metavar="MODEL", help="a model file saved by train --save")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")


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
    """Run ``gru4rec info``: the file's format, item count, configuration and tensors."""
    from gru4rec.checkpoint import file_info

    info = file_info(args.model)
    meta = info["meta"]
    config = meta.get("config", {})
    n_items = count_items(meta, info["tensors"])
    summary = {
        "file": args.model,
        "format_version": info["format_version"],
        "container": info["container"],
        "written_by": info["writer"],
        "size_bytes": info["size_bytes"],
        "n_items": n_items,
        "config": config,
        "tensors": info["tensors"],
    }
    extra = {k: v for k, v in meta.items() if k not in _NOT_SHOWN}
    if extra:
        summary["meta"] = extra
    if args.json:
        result(json.dumps(summary, indent=2))
        return EXIT_OK
    result(f"file: {args.model} ({info['size_bytes']:,} bytes)")
    result(f"format version: {info['format_version']} ({info['container']}, written by gru4rec {info['writer']})")
    result(f"items: {n_items if n_items is not None else 'unknown'}")
    for key, value in extra.items():
        result(f"{key}: {json.dumps(value)}")
    result("config:")
    for key, value in config.items():
        result(f"  {key} = {value if isinstance(value, str) else json.dumps(value)}")
    result("tensors:")
    for name, t in info["tensors"].items():
        result(f"  {name}: {t['dtype']} {'x'.join(map(str, t['shape'])) or 'scalar'}")
    return EXIT_OK
