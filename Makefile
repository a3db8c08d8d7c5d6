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

# Where torch comes from: pip's configured indexes by default (this project's CI finds the
# CPU wheel there). Elsewhere, PyPI's Linux wheel is the CUDA build with gigabytes of NVIDIA
# libraries: make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
install-dev: $(PY)
	$(PIP) torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
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
	XROUTER_TEST_REQUIRE_SERVICES=1 $(PY) -m pytest -q -p no:cacheprovider tests
