"""Tooling over a run directory shared by both objectives: inspection, verification, the store
check, time estimates, model cards, the starter recipe."""
