"""``gru4rec synth`` (write the synthetic data set) and ``gru4rec demo`` (synthetic data ->
train -> evaluate in one command)."""
from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gru4rec.cli.common import (
    DEVICE_FLAG,
    EXIT_OK,
    FORCE_FLAG,
    MODEL_FILE_EXAMPLE,
    PRECISION_FLAG,
    THREADS_FLAG,
    UsageError,
    add_flags,
    flag,
    flag_field,
    positive_int,
    uses_threads,
)
from gru4rec.cli.console import result
from gru4rec.cli.evaluate import evaluate_files
from gru4rec.cli.train import build_config, train_model
from gru4rec.errors import Gru4RecError

__all__ = ["DEMO_PARAMS", "SYNTH_KINDS", "DemoSettings", "SynthSettings", "add_demo_arguments", "add_synth_arguments", "run_demo",
           "run_synth"]

log = logging.getLogger(__name__)

#: Small settings that learn the synthetic data well in about 20 s on one quiet CPU core
#: (≈3.5 s per epoch over the default 25,000 synthetic sessions).
DEMO_PARAMS = ("loss=cross-entropy,layers=64,batch_size=32,n_sample=256,n_epochs=5,learning_rate=0.1,momentum=0.1,"
               "dropout_p_hidden=0.1,logq=1.0,sample_store_size=100000")


# ---------------------------------------------------------------------------------------- synth


#: The generators of ``gru4rec synth --kind``.
SYNTH_KINDS = ("sessions", "intents", "intents-attributes")


def _mix(text: str) -> tuple[float, float, float]:
    """``A,B,C``: the intents generator's mixture weights (transition, intent, popularity)."""
    parts = text.split(",")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected three weights A,B,C (transition, intent, popularity), got {text!r}")
    return values


_INTENTS = "--kind intents and intents-attributes"


@dataclass(frozen=True)
class SynthSettings:
    """The settings of ``gru4rec synth``: a field per flag, declared with it (None: the generator's default)."""

    out_dir: str = flag(metavar="OUT_DIR", help="folder for the files (created if missing)")
    kind: str = flag("--kind", choices=SYNTH_KINDS, default="sessions",
                     help="'sessions' (default): topics + successors + popularity, shaped like the rsc15 "
                          "sample; 'intents': a generative model whose Bayes-optimal next-item predictor is "
                          "known, with its Recall/MRR@k written to oracle.json (docs/datasets.md); 'intents-attributes': the "
                          "same with items in categories and brands (items.tsv) and new items clicked only in "
                          "test, the optimum on all, cold and warm targets in oracle.json (docs/attributes.md)")
    seed: int | None = flag("--seed", type=int, default=None, help="random seed of the generator")
    n_sessions: int | None = flag("--n-sessions", type=positive_int, default=None,
                                  help="number of sessions (default: the generator's)")
    n_items: int | None = flag("--n-items", type=positive_int, default=None, help="number of items (default: the generator's)")
    test_days: float | None = flag("--test-days", type=float, default=None,
                                   help="sessions starting in the last DAYS days form the test set (and, "
                                        "the same way, train_valid) (default: the generator's)")
    n_intents: int | None = flag("--n-intents", type=positive_int, group=_INTENTS, default=None,
                                 help="latent intents (default 50)")
    intent_size: int | None = flag("--intent-size", type=positive_int, group=_INTENTS, default=None,
                                   help="items of each intent (default 150; --kind intents only)")
    mix: tuple[float, float, float] | None = flag("--mix", type=_mix, metavar="A,B,C", group=_INTENTS, default=None,
                                                  help="next-item mixture: weight of the previous item's successors, of "
                                                       "the session's intent, of global popularity (default 0.2,0.65,0.15)")
    mean_length: float | None = flag("--mean-length", type=float, group=_INTENTS, default=None,
                                     help="mean session length (default 6)")
    cold_share: float | None = flag("--cold-share", type=float, group=_INTENTS, default=None,
                                    help="--kind intents-attributes: share of the items that are new, clicked only in "
                                         "test (default 0.1)")
    force: bool = flag_field(FORCE_FLAG, False)


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec synth`` (:class:`SynthSettings`)."""
    add_flags(parser, SynthSettings)


_INTENT_FLAGS = ("n_intents", "intent_size", "mix", "mean_length")


def run_synth(args: SynthSettings) -> int:
    """Run ``gru4rec synth``: the paths written are its result, one per line."""
    kwargs = {"seed": args.seed, "n_sessions": args.n_sessions, "n_items": args.n_items,
              "test_days": args.test_days}
    write: Callable[..., dict[str, Path]]
    if args.kind != "intents-attributes" and args.cold_share is not None:
        raise UsageError("--cold-share: only with --kind intents-attributes")
    if args.kind == "intents":
        from gru4rec.datasets.intents import write_intents as write

        kwargs.update({name: getattr(args, name) for name in _INTENT_FLAGS})
    elif args.kind == "intents-attributes":
        from gru4rec.datasets.intents_attributes import write_attribute_intents as write

        if args.intent_size is not None:
            raise UsageError("--intent-size: not with --kind intents-attributes (an intent is a few categories)")
        kwargs.update({name: getattr(args, name) for name in (*_INTENT_FLAGS, "cold_share") if name != "intent_size"})
    else:
        from gru4rec.datasets.synthetic import write_synthetic as write

        given = [f"--{name.replace('_', '-')}" for name in _INTENT_FLAGS if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --kind intents")
    paths = write(args.out_dir, force=args.force, **{k: v for k, v in kwargs.items() if v is not None})
    for path in _as_paths(paths):
        result(str(path))
    return EXIT_OK


def _as_paths(paths: Any) -> list[Any]:
    if isinstance(paths, dict):
        return list(paths.values())
    if isinstance(paths, (list, tuple)):
        return list(paths)
    return [paths]


# ----------------------------------------------------------------------------------------- demo


@dataclass(frozen=True)
class DemoSettings:
    """The settings of ``gru4rec demo``: a field per flag, declared with it."""

    workdir: str | None = flag("--workdir", metavar="DIR", default=None,
                               help="where to write the synthetic data and the model (default: a "
                                    "temporary folder, removed at the end)")
    params: str | None = flag("-ps", "--params", metavar="STR", default=None,
                              help=f"parameters on top of the demo's ({DEMO_PARAMS})")
    seed: int | None = flag("--seed", type=int, default=None, help="seed of the data generator and the model")
    n_sessions: int | None = flag("--n-sessions", type=positive_int, default=None,
                                  help="sessions in the synthetic data (default: the generator's; fewer is faster)")
    measure: list[int] = flag("-m", "--measure", metavar="K", type=positive_int, nargs="+",
                              default_factory=lambda: [1, 5, 10, 20], help="cutoffs (default: 1 5 10 20)")
    device: str = flag_field(DEVICE_FLAG, "auto")
    precision: str = flag_field(PRECISION_FLAG, "float32")
    threads: int | None = flag_field(THREADS_FLAG, None)


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec demo`` (:class:`DemoSettings`)."""
    add_flags(parser, DemoSettings)


@uses_threads
def run_demo(args: DemoSettings) -> int:
    """Run ``gru4rec demo``: the result lines are the saved model's on the synthetic test set."""
    from gru4rec.datasets.synthetic import write_synthetic
    from gru4rec.formats.checkpoint import MODEL_SUFFIX

    owned = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="gru4rec-demo-") if args.workdir is None else args.workdir)
    try:
        data_dir = workdir / "synthetic"
        start = time.perf_counter()
        kwargs: dict[str, Any] = {"force": True}
        if args.seed is not None:
            kwargs["seed"] = args.seed
        if args.n_sessions is not None:
            kwargs["n_sessions"] = args.n_sessions
        paths = write_synthetic(data_dir, **kwargs)
        train_path, test_path = _pick_train_test(paths, data_dir)
        log.info("Synthetic data in %s (%.2fs)", data_dir, time.perf_counter() - start)
        config = build_config(None, DEMO_PARAMS, seed=args.seed)
        if args.params:
            config = config.replace_from_string(args.params)
        model = train_model(str(train_path), config, device=args.device, precision=args.precision, threads=args.threads)
        model_path = workdir / f"model{MODEL_SUFFIX}"
        model.save(model_path, overwrite=True)
        if not owned:
            log.info("Saved model to %s", model_path)
        evaluate_files(model, [str(test_path)], cutoffs=args.measure, mode="conservative",
                       batch_size=512, extended=True)
        log.info("Demo finished in %.1fs. Next: 'gru4rec train YOUR_EVENTS.tsv -t YOUR_TEST.tsv "
                 "--save %s' (see gru4rec train --help)", time.perf_counter() - start, MODEL_FILE_EXAMPLE)
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    return EXIT_OK


def _pick_train_test(paths: Any, data_dir: Path) -> tuple[Path, Path]:
    """The train_full/test pair among the generator's outputs (whatever container it returns)."""
    if isinstance(paths, dict) and "train_full" in paths and "test" in paths:
        return Path(paths["train_full"]), Path(paths["test"])
    candidates = [Path(p) for p in _as_paths(paths)] + sorted(data_dir.glob("*"))
    train = next((p for p in candidates if p.name.startswith("train_full")), None)
    test = next((p for p in candidates if p.name.startswith("test")), None)
    if train is None or test is None:
        raise Gru4RecError(f"the synthetic generator wrote no train_full/test pair into {data_dir}")
    return train, test
