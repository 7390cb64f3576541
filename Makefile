# partex — two commands on a fresh machine: `make serve` and `make test`.
# JAX >= 0.11 needs Python >= 3.12: take the first such interpreter on the machine
# (PATH first, then pyenv's versions); `make PYTHON=...` overrides.
PYTHON ?= $(firstword $(foreach p,python3.12 python3.13 python3 \
            $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3) \
            $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3),\
            $(if $(shell $(p) -c 'import sys; print(sys.version_info >= (3, 12))' 2>/dev/null | grep True),$(p))))
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The exact versions the suite passed with (CPython 3.12): `make test` installs these and
# nothing newer, so a release elsewhere cannot change what CI runs. `make lock` rewrites it
# from .venv; `make test-latest` runs the suite on the newest releases pyproject allows.
LOCK   ?= requirements.lock
PIN    := $(if $(LOCK),-c $(LOCK))

.PHONY: install libs serve lint test test-latest lock chromium analyze clean which-python

$(STAMP): pyproject.toml $(LOCK) $(wildcard scripts/libmodels/*.txt)
	@test -n "$(PYTHON)" || { echo "make: partex's tests need Python >= 3.12 (JAX >= 0.11); none found on PATH or in ~/.pyenv/versions; pass PYTHON=/path/to/python3.12" >&2; exit 2; }
	@$(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIN) -e '.[test]'
	$(MAKE) --no-print-directory libs
	touch $(STAMP)

# The JAX libraries whose models the tests build (scripts/libmodels/<lib>.py): the pinned
# requirements, then (without their heavy dependency trees: tensorflow, google-cloud-...)
# the packages listed in *.nodeps.txt. jax stays at the version partex was installed with.
# With LATEST=1 (make test-latest) the libraries' own pins are dropped: their newest releases.
LIB_REQS   := $(wildcard scripts/libmodels/*.requirements.txt)
LIB_NODEPS := $(wildcard scripts/libmodels/*.nodeps.txt)
LIB_NAMES   = grep -hv '^ *\(\#\|$$\)' | $(if $(LATEST),sed 's/[=<>~!;].*//',cat) | sort -u
libs:
	$(PY) -m pip install -q $(PIN) $$(cat $(LIB_REQS) | $(LIB_NAMES)) "jax==$$($(PY) -c 'import jax; print(jax.__version__)')"
	$(if $(LIB_NODEPS),$(PY) -m pip install -q $(PIN) --no-deps $$(cat $(LIB_NODEPS) | $(LIB_NAMES)))

install: $(STAMP)

# Debian's chromium for the browser tests (Playwright's own download does not work here).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The explorer on http://127.0.0.1:5006/app (`partex serve`; see explorer/__init__.py).
serve: install
	$(PY) -m partex.explorer --address 127.0.0.1 --port 5006

# ruff, then pyright, over engine/ and explorer/ (settings and levels: pyproject's [tool.ruff] and
# [tool.pyright]); any finding fails. Pyright cannot follow the editable install's import hook, so
# it checks the package laid out as links in $(TYPECHECK)/partex (engine/ as partex, explorer/ as
# partex.explorer, demo_models/ linked for imports but not checked), and its report is rewritten
# to name the real files.
TYPECHECK := build/typecheck
lint: install
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK) && cp -rs $(CURDIR)/engine $(TYPECHECK)/partex && \
	  cp -rs $(CURDIR)/explorer $(TYPECHECK)/partex/explorer && ln -s $(CURDIR)/demo_models $(TYPECHECK)/partex/demo_models
	@status=0; echo "ruff check engine explorer"; $(PY) -m ruff check engine explorer || status=1; \
	  echo "pyright (engine/, explorer/)"; PYRIGHT_PYTHON_IGNORE_WARNINGS=1 \
	  $(PY) -m pyright --pythonpath $(abspath $(PY)) > $(TYPECHECK)/report.txt || status=1; \
	  sed -e 's|$(CURDIR)/$(TYPECHECK)/partex/explorer/|explorer/|' \
	      -e 's|$(CURDIR)/$(TYPECHECK)/partex/|engine/|' $(TYPECHECK)/report.txt; exit $$status

# lint first (seconds to a minute), then the suite on one pytest-xdist worker per core, at most
# four (each worker is a process with its own JAX); a test file stays on one worker, so
# its module fixtures are built once. `make test WORKERS=0` runs it in this process.
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
test: install chromium lint
	$(PY) -m pytest -q --durations=25 $(if $(filter-out 0 1,$(WORKERS)),-n $(WORKERS) --dist loadfile)

# The suite in a virtualenv of its own (.venv-latest) on the newest releases that pyproject's
# ranges allow (the test libraries' newest too), then what moved against the lock.
test-latest:
	$(MAKE) --no-print-directory VENV=.venv-latest LOCK= LATEST=1 install
	@echo "versions that differ from requirements.lock (< locked, > latest):"
	@grep -v '^#' requirements.lock > .venv-latest/locked.txt
	@.venv-latest/bin/python -m pip freeze --exclude-editable | diff .venv-latest/locked.txt - | grep '^[<>]' || echo "  none"
	$(MAKE) --no-print-directory VENV=.venv-latest LOCK= LATEST=1 test

# Rewrite the lock from .venv (after the suite passed there).
lock:
	@{ echo "# The versions \`make test\` installs (CPython 3.12): \`make lock\` writes this from .venv"; \
	   $(PY) -m pip freeze --exclude-editable; } > $(LOCK)

clean:
	rm -rf $(VENV) .venv-latest .jax_cache $(TYPECHECK)

which-python:
	@echo $(PYTHON)
