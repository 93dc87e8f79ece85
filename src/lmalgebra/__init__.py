"""lmalgebra: how much of one language model is contained in others, and merging several into one.

Pipeline stages, one subpackage or module each:

- ``sources``: model references and text corpora (hub ids or local directories, many file formats);
- ``lmd``: Language Model Decomposition: spans -> embeddings -> second moments -> ridge fits
  -> report.
"""

__version__ = "0.1.0"
