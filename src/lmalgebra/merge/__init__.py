"""MergeDistill: teachers' masked LMs merged into one multilingual student."""
