"""The Python API: what the command line does, callable from a notebook with labelled results.

``decompose.py`` (decompose, spans), ``decomposition.py`` (the result, and runs read back),
``model_inputs.py`` (models and texts as Python values), ``frames.py`` (tables as DataFrames),
``merge.py`` (MergeDistill stages), ``runtime.py`` (thread pinning and quiet logging per call).
``lmalgebra`` re-exports the public names.
"""
