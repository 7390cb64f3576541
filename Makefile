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

.PHONY: install libs serve test chromium analyze clean which-python

$(STAMP): pyproject.toml $(wildcard scripts/libmodels/*.txt)
	@test -n "$(PYTHON)" || { echo "make: partex's tests need Python >= 3.12 (JAX >= 0.11); none found on PATH or in ~/.pyenv/versions; pass PYTHON=/path/to/python3.12" >&2; exit 2; }
	@$(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(MAKE) --no-print-directory libs
	touch $(STAMP)

# The JAX libraries whose models the tests build (scripts/libmodels/<lib>.py): the pinned
# requirements, then (without their heavy dependency trees: tensorflow, google-cloud-...)
# the packages listed in *.nodeps.txt. jax stays at the version partex was installed with.
LIB_REQS   := $(wildcard scripts/libmodels/*.requirements.txt)
LIB_NODEPS := $(wildcard scripts/libmodels/*.nodeps.txt)
libs:
	$(PY) -m pip install -q $(foreach f,$(LIB_REQS),-r $(f)) "jax==$$($(PY) -c 'import jax; print(jax.__version__)')"
	$(if $(LIB_NODEPS),$(PY) -m pip install -q --no-deps $(foreach f,$(LIB_NODEPS),-r $(f)))

install: $(STAMP)

# Debian's chromium for the browser tests (Playwright's own download does not work here).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The explorer on http://127.0.0.1:5006/app (`partex serve`; see explorer/__init__.py).
serve: install
	$(PY) -m partex.explorer --address 127.0.0.1 --port 5006

test: install chromium
	$(PY) -m pytest -q --durations=25

clean:
	rm -rf $(VENV) .jax_cache

which-python:
	@echo $(PYTHON)
