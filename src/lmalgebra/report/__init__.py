"""Report of a decomposition run: one figure per study table, one self-contained HTML page."""
