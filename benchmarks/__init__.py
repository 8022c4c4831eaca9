"""Speed, memory and scale measurements of gru4rec, run from the repository root as modules.

    python -m benchmarks.train.train_speed --help

One subpackage per subject: ``train`` (the training step and epochs, against the official port
too), ``eval`` (evaluation), ``serve`` (the HTTP server and its session stores), ``gpu`` (the
GPU kernels' profile and the GPU tuning window), ``pipeline`` (preprocessing, the whole pipeline
at scale, model files and exports, paropt at scale) and ``repeats`` (repeat clicks and the
repeat boost). :mod:`benchmarks.workloads` holds what the training benchmarks share. The figures
and the command of each are in benchmarks/README.md; how they came about, in docs/speed-history.md.
"""
