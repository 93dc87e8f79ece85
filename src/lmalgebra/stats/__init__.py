"""Pure statistics: moments, ridge solver, alpha choice, bootstrap, nulls, similarity, attribution.

Arrays in, numbers out: nothing here reads corpora or models.
"""
