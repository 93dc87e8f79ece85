"""A decomposition planned before any work: shapes, estimates, the plan's table."""
