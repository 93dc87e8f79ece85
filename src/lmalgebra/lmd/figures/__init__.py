"""The figures of a decomposition run."""
