"""Serving: the HTTP server under load, its session stores' memory, replicas under failure, the engine alone."""
