# fp4repro: `make repro` sets everything up and runs the default study; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist workers (0: one process), one more than the cores: a full run on 2 cores used 1.3 of
# them, the rest spent waiting on Slurm's polling, subprocesses and the shared smoke run's lock;
# tests/conftest.py shares the tests out
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# Python writes the bytecode of what it imports (into .venv and src/): every test and workflow process
# imports torch, pandas and seaborn, and where PYTHONDONTWRITEBYTECODE is set each one would compile
# them from source again (a figure process: 8.8 CPU-s, 5.9 with the bytecode kept)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test repro slurm-profile clean

setup: $(STAMP)   ## create .venv with the pinned dependencies (idempotent)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# --no-compile: pip would byte-compile every installed module (~55 s on 2 cores); Python compiles
	# only what is imported, at first import (~18 s over a test run)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[test]'
	@touch $(STAMP)

test: setup   ## lint and format check, the docs site built strictly, then the whole test suite (a worker per core and one more) (gpu tests skip without CUDA; tests/cli/test_docs.py checks the generated pages); exit code 5 = nothing collected
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	@site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $$site; rc=$$?; rm -rf $$site; exit $$rc
	@$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

EXPERIMENT ?= tiny
CORES      ?= 2
SNAKEMAKE  := $(BIN)/snakemake

repro: setup   ## the whole study of EXPERIMENT (default tiny) through Snakemake: data, train, evaluate, figures, report
	$(BIN)/fp4repro explain
	$(SNAKEMAKE) --cores $(CORES) --config experiment=$(EXPERIMENT)
	@echo "figures: figures/$(EXPERIMENT)/   report: paper/$(EXPERIMENT)/report.md   logs: logs/$(EXPERIMENT)/"

SLURM_PROFILE_DIR := $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake/slurm

slurm-profile:   ## install workflow/profiles/slurm as your `slurm` profile: then `snakemake --profile slurm`
	@mkdir -p $(SLURM_PROFILE_DIR)
	cp workflow/profiles/slurm/config.yaml $(SLURM_PROFILE_DIR)/config.yaml
	@echo "installed $(SLURM_PROFILE_DIR)/config.yaml: edit slurm_partition (and slurm_account) for your cluster"

clean:
	rm -rf $(VENV) .pytest_cache
