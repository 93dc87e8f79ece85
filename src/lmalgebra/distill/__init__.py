"""MergeDistill: teachers' masked copies, top-k store, union vocabulary, student training."""
