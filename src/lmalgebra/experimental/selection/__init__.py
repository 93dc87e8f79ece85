"""Choosing teachers before distillation: LMD complementarity against held-out quality."""
