# The README's two commands: `make demo` (train the toy policy, write its report) and
# `make test` (the whole test suite, notebooks included). Both create .venv if missing.
PYTHON ?= python3
# torch 2.13.0, the CPU build; any recent torch works (TORCH=torch: the newest). On Linux, PyPI's
# torch is the multi-GB CUDA build, so there TORCH_INDEX defaults to torch's CPU index:
# tools/torch_index.py installs the requested torch as pip resolves it when that is a CPU build
# (a local wheel folder, a mirror), and from the CPU index when it would be CUDA. A GPU machine
# opts in: `make env TORCH_INDEX=` (PyPI's CUDA build) or TORCH_INDEX=<a CUDA index URL>.
TORCH ?= torch==2.13.0
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),$(CPU_INDEX))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# one torch thread per process: pytest-xdist already runs two processes on two cores.
# GRPO_LAB_MODELS points at a folder that holds no model, so the suite (notebook 10 included)
# runs on the shipped tiny HF model whatever ~/.cache/grpo_lab/models holds, as on a fresh CI
# machine: the suite's time and results do not depend on a 538 MB download.
TEST_ENV := GRPO_LAB_QUICK=1 OMP_NUM_THREADS=1 MPLBACKEND=Agg GRPO_LAB_MODELS=$(CURDIR)/runs/no-models

.PHONY: demo test env bench pretrain lab preflight workshop clean docs

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	TORCH_SOURCE="$$($(BIN)/python tools/torch_index.py "$(TORCH)" "$(TORCH_INDEX)")" && \
		$(BIN)/pip install --quiet $$TORCH_SOURCE "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,fast,lab,hf,lora,docs,gguf]"
	touch $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/grpo-lab train --preset tiny_cpu --out_dir runs/demo --overwrite

test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -n 2 --dist loadscope \
		tests notebooks --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
		--durations=25

pretrain: $(STAMP)
	$(BIN)/grpo-lab pretrain

bench: $(STAMP)
	$(BIN)/python bench/bench_kv_cache.py --threads 1
	$(BIN)/python bench/bench_codecs.py
	$(BIN)/python bench/bench_sharder.py
	PYTHONPATH=. $(BIN)/python bench/bench_grouping.py --threads 1

# Quick mode on (GRPO_LAB_QUICK=1) unless set: `make lab GRPO_LAB_QUICK=0` for full-size runs.
lab: $(STAMP)
	$(BIN)/grpo-lab lab

# What a learner runs on arrival (notebooks/WORKSHOP.md): OK or what is wrong.
preflight: $(STAMP)
	$(BIN)/grpo-lab preflight

# Before a workshop (notebooks/WORKSHOP.md): the exercises match their solutions, every lesson
# and solution runs in quick mode, every exercise stub fails its checks with a hint.
workshop: $(STAMP)
	$(BIN)/python notebooks/exercises/make_exercises.py --check
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_exercise_notebooks.py \
		notebooks --nbval-lax --nbval-current-env --nbval-cell-timeout=900

# The wheel, dist/grpo_lab-0.1.0-py3-none-any.whl (3.4 MB: the package, data/ and the lessons),
# built with this environment's setuptools (nothing downloaded); build/ goes first, so no file
# deleted since the last build ships. `make test` checks such a wheel (tests/test_wheel.py).
.PHONY: wheel
wheel: $(STAMP)
	rm -rf build dist
	$(BIN)/python -m pip wheel --no-deps --no-build-isolation -w dist .


# The course site into site/ (docs/site.md): every lesson with its quick-mode outputs (the saved
# runs in runs/executed/ when current, else run here: it says which, and how long the last build
# took, before starting), the pages of docs/, the API; offline, opened from the file or served,
# and it fails on a broken internal link. `make docs-quick` executes nothing: every lesson from
# its saved run, even one edited since (seconds instead of minutes).
# (make env installs the docs extra too: the suite checks the site's link validation)
DOCS_ENV := GRPO_LAB_QUICK=1 OMP_NUM_THREADS=1 NO_MKDOCS_2_WARNING=1 GRPO_LAB_MODELS=$(CURDIR)/runs/no-models
.PHONY: docs-quick
docs: $(STAMP)
	$(DOCS_ENV) $(BIN)/python docs/build.py

docs-quick: $(STAMP)
	$(DOCS_ENV) $(BIN)/python docs/build.py --quick

clean:
	rm -rf runs .pytest_cache build dist site
