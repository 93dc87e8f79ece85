"""Spans: drawn from the corpus once, and remembered."""
