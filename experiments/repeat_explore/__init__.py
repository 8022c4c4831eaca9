"""The learned repeat/explore mixture on top of a fitted GRU4Rec (issue 38): a measured no (docs/results.md)."""
