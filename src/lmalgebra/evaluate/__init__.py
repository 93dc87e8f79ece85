"""Evaluations of any model, beyond a MergeDistill run's own: universal POS tagging on CoNLL-U
treebanks (a linear probe on frozen states, or fine-tuning; ``pos_tagging``), and how much of one
model another carries by LMD (``lmd_coverage``, which a causal run's evaluation reports)."""
