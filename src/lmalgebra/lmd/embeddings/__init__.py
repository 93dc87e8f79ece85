"""Embeddings: the one embedding loop, its cache, and models handed over as Python objects."""
