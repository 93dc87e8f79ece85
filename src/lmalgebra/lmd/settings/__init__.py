"""A decomposition's settings: the recipe, scale and study sections, embedding settings, span
definitions."""
