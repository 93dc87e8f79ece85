"""Tokens across tokenizers: token forms, the union vocabulary, edit distance, the MinED map, byte
alignment, and the tokenizers a student or teacher can have (choice and trainers)."""
