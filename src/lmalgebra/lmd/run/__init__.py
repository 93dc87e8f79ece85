"""A decomposition run: the pipeline, its analysis and sweeps, its outputs, the entry point."""
