"""MergeDistill: several teacher LMs, each with its own tokenizer and languages, distilled into
one student; two objectives behind one interface.

- ``recipe.py``: the recipe, a ``MaskedRecipe`` or a ``CausalRecipe`` (``objective``);
  ``pipeline.py`` chooses the objective from it, once, and runs the stages in order
  (prepare -> teach -> vocab -> train; evaluate); ``objective.py`` is the interface every
  objective implements (prepare, teach, vocab, check the store, train, evaluate, plan, inspect).
- ``masked/``: masked-LM teachers (MergeDistill): masking, the top-k store, the union vocabulary,
  the BERT student, seeding, training, plan and held-out masked-token scores.
- ``causal/``: causal LM teachers with any tokenizers: the log-probability store, a student with
  a tokenizer of its own, cross-tokenizer training, plan and held-out bits per byte.
- Shared: ``layout.py`` (the run directory, the model-directory writer), ``examples.py``,
  ``teachers.py`` (the one loader, inference over a store's shards), ``sampling.py`` (languages
  per batch), ``student.py`` (model sizes, what a student's training depends on); ``vocab/``
  (tokens across tokenizers), ``pretrain/`` (teachers made here), ``run/`` (tooling over a run).
"""
