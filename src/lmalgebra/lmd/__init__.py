"""Language Model Decomposition: spans -> embeddings -> second moments -> ridge fits -> report."""
