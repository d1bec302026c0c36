# One entry point for newcomers and CI alike. `make test` builds its own virtual environment
# from the project's files, then runs lint, types and the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Three pytest-xdist workers on the machine's two cores by default: a third of the suite's wall
# is processes waiting (servers starting, leases lapsing), which a third worker fills (on 6
# December, same tree one after the other: 668 s on two workers, 543 on three, 547 on four;
# bench/README.md, "The test suite"). The cgroup tests and the heaviest drills run one after
# another on one worker each, the longest other tests start first (tests/conftest.py).
# `make test PYTEST_ARGS=` runs the suite serially. The drills assert what does not depend on
# speed, so a busy core does not fail them.
PYTEST_ARGS ?= -n 3 --dist loadgroup

.PHONY: all venv test lint types pytest docs demo demo-agent demo-effects bench bench-quick bench-peers-venv bench-runner-venv litellm-venv clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import venv, ensurepip" 2>/dev/null || { echo "make: $(PYTHON) lacks the venv module (on Debian: apt-get install python3-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[supervisor,postgresql,fast,dev,otel,mcp]'
	# supervisord's wheel, which tests/packaging/test_wheel_install.py installs beside tether's (offline).
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: -d $(VENV)/wheels 'supervisor>=4.2'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The documentation site (mkdocs.yml): --strict fails the build on any broken link or anchor.
# NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2, which this site does not use.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

test: lint types docs pytest

demo: $(STAMP)
	$(BIN)/python -m examples.demo

demo-agent: $(STAMP)
	$(BIN)/python -m examples.demo_agent

demo-effects: $(STAMP)
	$(BIN)/python -m examples.demo_effects

# The oldest Python the project promises (`requires-python`): Debian 12's own /usr/bin/python3,
# 3.11.2. A second venv on it runs the three demos and a quick slice of the suite (the wire
# records, the API's routes, the task commands); CI runs this after `make test`.
OLDEST_PYTHON ?= /usr/bin/python3
OLDEST_VENV ?= .venv-oldest
OLDEST_SLICE ?= tests/wire/test_wire_records.py tests/supervisor/api/test_api_routes.py tests/supervisor/test_cli_task_commands.py

oldest-python:
	$(MAKE) PYTHON=$(OLDEST_PYTHON) VENV=$(OLDEST_VENV) demo demo-agent demo-effects
	$(OLDEST_VENV)/bin/python -c 'import sys; print("oldest python", sys.version.split()[0])'
	$(OLDEST_VENV)/bin/pytest -q $(OLDEST_SLICE)

# The peers (Huey, DBOS) live in a venv of their own, never in the project's.
PEERS_VENV := bench/.peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed-stamp

$(PEERS_STAMP): bench/requirements-peers.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	touch $(PEERS_STAMP)

bench-peers-venv: $(PEERS_STAMP)

# LiteLLM's proxy, for tests/runner/test_litellm_mock.py (skipped without it): 750 MB, its own venv.
LITELLM_VENV := bench/.litellm-venv
LITELLM_STAMP := $(LITELLM_VENV)/.installed-stamp

$(LITELLM_STAMP): bench/requirements-litellm.txt
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet -r bench/requirements-litellm.txt
	touch $(LITELLM_STAMP)

litellm-venv: $(LITELLM_STAMP)

# The runner as a borrowed server installs it: the wheel and its base dependencies only, for
# the idle RSS figure (bench/runner_rss.py). Made anew whenever the sources may have changed.
RUNNER_VENV := bench/.runner-venv

bench-runner-venv:
	rm -rf $(RUNNER_VENV)
	$(PYTHON) -m venv $(RUNNER_VENV)
	$(RUNNER_VENV)/bin/python -m pip install --quiet .

bench: $(STAMP) $(PEERS_STAMP) bench-runner-venv
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
