"""Inputs: model references (hub ids, local directories, random-initialised copies) and corpora."""
