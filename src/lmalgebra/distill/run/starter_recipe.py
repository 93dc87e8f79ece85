"""``lmalgebra merge init``: a commented starter recipe that runs offline as written.

The recipe merges two teachers that ``lmalgebra pretrain`` makes from the packaged Wikipedia text
(the commands are in its header); every section is shown with its main keys, their defaults
and what they do (the other keys: `--help` of the commands, the recipe's field descriptions).
"""

from __future__ import annotations

from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.output_paths import check_file, refuse_inside_other_output, tidy_on_failure

STARTER = """\
# MergeDistill recipe: several teacher masked LMs -> one multilingual student.
# Teachers for this starter, made offline from packaged Wikipedia text (a few minutes each):
#   lmalgebra pretrain masked --corpus.paths package:wiki-en --corpus.text_column extract \\
#       --language en --tokenizer.vocab_size 3000 --out teachers/en
#   lmalgebra pretrain masked --corpus.paths package:wiki-fr --corpus.text_column extract \\
#       --language fr --tokenizer.vocab_size 3000 --out teachers/fr
# Then: lmalgebra merge run RECIPE; lmalgebra merge train RECIPE; lmalgebra merge evaluate RUN_DIR

languages:                     # language code -> its text and the teachers that cover it
  en:
    corpus: {paths: [package:wiki-en], text_column: extract}
    teachers: [en]             # several teachers per language are allowed
    max_examples: 2000         # at most this many documents (null: all)
  fr:
    corpus: {paths: [package:wiki-fr], text_column: extract}
    teachers: [fr]
    max_examples: 2000

objective: masked              # masked: masked-LM teachers (MergeDistill) | causal: causal LMs,
                               # any tokenizers (teachers from `lmalgebra pretrain causal`)

teachers:                      # name -> a masked LM with a trained head
  en: {path: teachers/en}      # a directory, a hub id (org/name) or package:NAME
  fr: {path: teachers/fr}      # trust_remote_code: true only for models you trust

masking:                       # which tokens each teacher predicts
  probability: 0.15            # share of tokens each teacher predicts
  replace: [0.8, 0.1, 0.1]     # of those: [MASK], random token, unchanged
  whole_word: false            # mask whole words
  seed: 0

example_length: 128            # tokens per example, per teacher's tokenizer
# A recipe with `objective: causal` has no masking and no example_length; it has instead:
# causal:
#   example_bytes: 2048        # each document cut to its first N UTF-8 bytes: same text per teacher
#   samples: 0                 # tokens drawn from each teacher's distribution per position
#   sample_seed: 0
# teacher_text:                # text a teacher writes for a language (none by default)
#   fr: {teacher: fr, prompts: {paths: [fr-prompts.txt]}, documents: 100, new_tokens: 64}
# and its student a tokenizer of its own (student.tokenizer: teacher:NAME, train:KIND:SIZE,
# bytes or a model reference) and no embedding_size, vocab_size or init_embeddings, or starts
# from a pre-trained causal LM (student.init: MODEL_REF, its tokenizer and sizes; student.layers:
# [0, 5, 11] keeps those layers); its training a mix of losses (training.objective_mix).
heldout_fraction: 0.05         # examples held out for evaluation (by id: stable)
top_k: 8                       # teacher log-probabilities kept per masked token (causal: per token)
batch_size: 32                 # examples per teacher forward pass
dtype: float32                 # teacher inference: float32 | bfloat16 | auto (bf16 where native)
device: cpu                    # teacher inference: cpu | cuda | auto (cuda when present)
shard_rows: 1024               # examples per store shard (the unit of resumption)
output_dir: runs/merge         # the run directory

student:                       # a BERT masked LM over the union vocabulary
  hidden_size: 256
  num_layers: 4
  num_heads: 4
  intermediate_size: 1024
  embedding_size: null         # ALBERT-style factorised embeddings when set (e.g. 128)
  max_position_embeddings: 512
  init_embeddings: random      # teachers (experimental): embeddings seeded from the teachers'

training:
  steps: 1000
  batch_size: 32
  lr: 5.0e-4
  warmup_steps: 100
  lambda_schedule: linear      # KD weight: constant | linear 1->0 | cosine 1->0
  temperature: 1.0
  sampling_exponent: 0.7       # languages sampled with p_k ~ n_k^sampling_exponent
  multi_teacher: all           # several teachers for a language: all copies | best
  teachers: null               # [NAME, ...]: distil from these teachers only (null: every one)
  gold_only: false             # true: MLM on gold labels only (no distillation)
  checkpoint_every: 200
  seed: 0
"""


def write_starter(path: Path, force: bool = False) -> Path:
    """Write the starter recipe to ``path`` (never over an existing file unless ``force``)."""
    check_file(path, "recipe file")  # a directory there: no --force would replace it
    refuse_inside_other_output(path, "recipe file")  # --force replacing a run's own file
    if path.exists() and not force:
        raise UserInputError(f"{path} exists; choose another name or pass --force to replace it")
    with tidy_on_failure(path.parent, deep=False):
        write_text_atomic(path, STARTER)
    return path
