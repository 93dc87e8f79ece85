"""The offline demo: teachers pre-trained here, merged by MergeDistill, evaluated, decomposed."""
