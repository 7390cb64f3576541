# partex — two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install serve test chromium analyze clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the browser tests (Playwright's own download does not work here).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The explorer on http://127.0.0.1:5006/app (`partex serve`; see explorer/__init__.py).
serve: install
	$(PY) -m partex.explorer --address 127.0.0.1 --port 5006

test: install chromium
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .jax_cache
