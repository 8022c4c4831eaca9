"""Why GRU4Rec stays below 90 % of the intents benchmark's optimum on 20,000 sessions (issue 51):
a plug-in Bayes rule with tables estimated from the training sessions (docs/results.md)."""
