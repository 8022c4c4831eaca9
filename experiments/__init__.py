"""Experiments whose answer was no, kept runnable with their tests (results: docs/results.md)."""
