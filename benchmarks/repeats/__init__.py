"""Repeat clicks: their share in the data sets, and what the fitted repeat boost gives."""
