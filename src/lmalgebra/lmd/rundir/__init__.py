"""A decomposition run directory: its schema, its files, statistics files and reduction record."""
