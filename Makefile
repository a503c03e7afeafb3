# fp4repro: `make repro` sets everything up and runs the default study; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test repro bench clean

setup: $(STAMP)   ## create .venv with the pinned dependencies (idempotent)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

test: setup   ## the whole test suite (gpu tests skip without CUDA); exit code 5 = nothing collected
	@$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

EXPERIMENT ?= tiny

repro: setup   ## prepare the tiny data, train and evaluate every recipe of the experiment (resumable)
	$(BIN)/fp4repro explain
	$(BIN)/fp4repro prepare-data --experiment $(EXPERIMENT)
	@for r in $$($(BIN)/fp4repro experiment $(EXPERIMENT) --recipes); do \
		echo "== train $(EXPERIMENT) / $$r"; $(BIN)/fp4repro train --experiment $(EXPERIMENT) --recipe $$r || exit $$?; \
		echo "== evaluate $(EXPERIMENT) / $$r"; $(BIN)/fp4repro evaluate --experiment $(EXPERIMENT) --recipe $$r || exit $$?; done

clean:
	rm -rf $(VENV) .pytest_cache
