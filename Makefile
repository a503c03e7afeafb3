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

repro: setup   ## validate every recipe, walk the quantizer through an example, benchmark it
	$(BIN)/fp4repro recipe
	@for r in $$($(BIN)/fp4repro recipe); do $(BIN)/fp4repro recipe $$r --layers 52 > /dev/null && echo "recipe $$r: valid"; done
	$(BIN)/fp4repro explain
	$(BIN)/fp4repro bench quant

clean:
	rm -rf $(VENV) .pytest_cache
