"""Downstream evaluation of encoders: universal POS tagging on CoNLL-U treebanks."""
