"""Statistics: the passes over a measurement's embeddings."""
