# make serve : install and start the gateway on its embedded default (the demo).
# make test  : install everything (CPU torch for training, promtool) and run lint, types and the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: serve test install install-dev lint

$(PY):
	python3 -m venv $(VENV)
	$(PIP) -U pip

install: $(PY)
	$(PIP) .

install-dev: $(PY)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[train,verl,dev]'
	scripts/tools.sh $(VENV)

serve: install
	$(VENV)/bin/xrouter serve

lint:
	$(VENV)/bin/ruff check pricing router gateway training tests bench scripts
	$(VENV)/bin/ruff format --check pricing router gateway training tests bench scripts
	$(VENV)/bin/mypy

test: install-dev
	scripts/services.sh
	$(MAKE) lint
	$(PY) -m pytest -q -p no:cacheprovider tests
