# fairq — the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help install demo test test-fast lint bench envtest slurm browsers prometheus kustomize checkov clean

help:
	@echo "make demo   - run fairq locally: SQLite, in-process worker, simulated cluster"
	@echo "make test   - install what is needed and run the whole suite"
	@echo "make lint   - ruff and mypy"
	@echo "make bench  - run the benchmarks in bench/ (prints BENCH lines)"

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,sim]'
	@touch $@

install: $(VENV)/.installed

demo: install
	DJANGO_SETTINGS_MODULE=config.settings.demo $(PY) manage.py migrate --noinput -v0
	DJANGO_SETTINGS_MODULE=config.settings.demo $(PY) manage.py seed_demo
	DJANGO_SETTINGS_MODULE=config.settings.demo PORT=$(PORT) $(PY) manage.py rundemo

# The real Kubernetes control plane for tests marked k8s (built once into a cache).
# Needs root and apt; elsewhere the k8s tests are skipped unless FAIRQ_REQUIRE_ENVTEST=1.
envtest:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		bash tests/envtest/build.sh; \
	else echo "envtest: not root or no apt-get: k8s tests will be skipped"; fi

# Debian's Slurm 22.05 and munge, configured under ~/.cache/fairq-slurm: the peer of
# bench/bench_vs_slurm.py (which runs this itself). Needs root and apt; elsewhere it says so.
slurm:
	@bash bench/slurm/install.sh

# Debian's Chromium for the browser tests (playwright drives it; no browser download).
browsers:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get install -y -q chromium >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) && \
		echo "browsers: installed Debian chromium"; \
	else echo "browsers: no chromium and no apt-get: browser tests will be skipped"; fi

# Debian's prometheus for promtool (the alert rules are checked and unit-tested with it).
prometheus:
	@if command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null)) && \
		echo "prometheus: installed Debian prometheus (promtool)"; \
	else echo "prometheus: no promtool and no apt-get: alert-rule tests will be skipped"; fi

# kubectl with Kustomize >= v5 renders platform/k8s (its overlays use components and
# replacements). Neither Debian (kubernetes-client 1.20 embeds Kustomize v2.0.3) nor PyPI
# ships one; the machine image's kubectl (google-cloud-cli's, Kustomize v5.5) does.
# Without it the platform manifest tests skip, unless FAIRQ_REQUIRE_KUSTOMIZE=1 (CI).
kustomize:
	@if kubectl version --client 2>/dev/null | grep -Eq '^Kustomize Version: v([5-9]|[1-9][0-9])\.'; then :; \
	else echo "kustomize: no kubectl with Kustomize >= v5: platform manifest tests will be skipped"; fi

# checkov, the manifest security scan of the rendered overlays (tests/test_platform_scan.py),
# in a venv of its own under ~/.cache: its dependencies stay out of fairq's.
CHECKOV_VENV := $(HOME)/.cache/fairq-checkov
CHECKOV_VERSION := 3.3.30
checkov:
	@if [ -x $(CHECKOV_VENV)/bin/checkov ] && [ "$$($(CHECKOV_VENV)/bin/checkov --version)" = $(CHECKOV_VERSION) ]; then :; \
	else $(PYTHON) -m venv $(CHECKOV_VENV) && $(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION) \
		&& echo "checkov: installed $(CHECKOV_VERSION) in $(CHECKOV_VENV)" \
		|| echo "checkov: could not install: the manifest scan will be skipped"; fi

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy queueing accounts config
	$(VENV)/bin/lint-imports

test: install envtest browsers prometheus kustomize checkov
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy queueing accounts config
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run --settings=config.settings.test >/dev/null \
		|| (echo "models changed without a migration: run makemigrations" && exit 1)
	$(VENV)/bin/pytest

test-fast: install
	$(VENV)/bin/pytest -m "not k8s and not browser" -x -q

bench: install
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) db.sqlite3 staticfiles .pytest_cache .mypy_cache .ruff_cache
