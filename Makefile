# One entry point for people and CI. `make up` and `make test` are the README's quick start.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STACK ?= local

.PHONY: setup test lint emulator up down plan refresh offline-up offline-down bench-proxy bench-proxy-instructions bench-proxy-timeline bench-providers gateway-config gateway gateway-stop review-demo release-demo promtool clean

setup: $(STAMP)

# pip runs quietly: a line before each long step says what it does and how long it takes
# (issue 34 item 8: a fresh machine's first `make up` was silent for minutes).
# Two editable installs: the product (pyproject.toml) and the dev tools beside it (dev/: the
# emulator, the Pulumi engine stand-in, the stand-in serving engine, the benches, the test and
# lint tools), which the tests, `make up` and CI need and the product's wheel does not ship.
$(STAMP): pyproject.toml dev/pyproject.toml
	@echo "setup: installing the pinned dependencies into $(VENV) (a fresh machine: 30 s to 2 min; pip is quiet meanwhile)..."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e . -e ./dev
	touch $(STAMP)
	@echo "setup: $(VENV) ready."

# LiteLLM (the gateway the stack outputs feed) lives in its own venv: its pins clash with ours.
# 1.106.12 is the newest litellm[proxy] whose dependencies the package registry holds.
LITELLM_VENV := $(VENV)/litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed

$(LITELLM_STAMP): | $(STAMP)
	@echo "setup: installing LiteLLM 1.106.12 into $(LITELLM_VENV) for the gateway (once; 1 to 3 min; pip is quiet meanwhile)..."
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet 'litellm[proxy]==1.106.12'
	touch $(LITELLM_STAMP)
	@echo "setup: $(LITELLM_VENV) ready."

# The test command CI runs (.ci/run): lint first (ruff + mypy must be clean), then pytest.
# pytest exits 5 when no test ran: that fails too. Three worker processes (pytest-xdist), each
# test file on one worker (its module fixtures stay whole); every fixture uses free ports and
# its own temp dirs, so the workers never share an emulator or a port. Three on 2 cores: much
# of the suite waits (cold starts, health polls, LiteLLM start-up), and a third worker fills
# those waits (same quiet 2-core machine: 4 min 47 s with three, 5 min 38 s with two).
# promtool checks the generated alert rules (tests/monitoring): Debian's prometheus package
# (2.42.0), installed once where apt can (root, as on CI); elsewhere those tests are skipped
# and say how to install it.
promtool:
	@command -v promtool >/dev/null || { \
	  echo "setup: installing promtool (Debian's prometheus package, ~15 s; apt is quiet meanwhile)..."; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo -n ); \
	  { $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -qq >/dev/null 2>&1 && \
	      $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; }; } && \
	  echo "setup: promtool $$(promtool --version 2>&1 | head -1 | cut -d' ' -f3) ready." || \
	  echo "setup: WARNING: could not install promtool (needs root and Debian's apt): tests/monitoring's promtool tests will be skipped"; }

test: setup $(LITELLM_STAMP) promtool lint
	$(PY) -m pytest -q -n 3 --dist loadfile

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy dev/emulator dev/pulumi_standin dev/bench dev/standin_engine.py components serving watchers tests scripts __main__.py
	$(VENV)/bin/mypy access  # its own run: a second __main__.py cannot share one with the root's

# This checkout's Modal control plane + runtime on loopback, in the foreground (Ctrl-C stops it).
# Same state, pid file and port choice as `make up`'s (8790, else a free port when another
# checkout or program holds it; EMULATOR_PORT=N insists on N), so `make up` reuses it and
# `make down` stops it.
emulator: setup
	./scripts/emulator.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# ---- The Pulumi program (issue: program, stacks, CI) ----
# Main job on a fresh machine: venv, emulator, `pulumi up` of the local stack (the Pulumi CLI,
# else the pulumi_standin), then a chat completion through the edge and a curl that works.
# `make down` destroys it (either engine) and stops the emulator. PULUMI_ENGINE=cli|standin.
up: setup
	./scripts/up.sh $(STACK)

down: setup
	./scripts/down.sh $(STACK)

# Offline stand-in for `pulumi preview --diff` / `pulumi up` on machines without the Pulumi CLI:
# the pulumi_standin package (dev/pulumi_standin): program under mocks + the SDK's provider server + the emulator (docs/offline.md).
# NOT the Pulumi engine. Pulumi.yaml's `options: refresh: always` makes every preview, up and
# destroy read each resource back from Modal first (both engines), so `plan` shows drift and
# why (e.g. "live app stopped by hand") and `up` heals it; `plan` then needs this checkout's
# emulator when the stack has resources (none: a fresh stack, or dev/prod, plans without one).
# `plan` and `refresh` use `make up`'s state file for the local stack ($STANDIN_STATE).
# `offline-up`/`offline-down` use this checkout's emulator (`make emulator`), never another checkout's.
STANDIN_STATE_ARG = $(if $(filter local,$(STACK)),$(if $(STANDIN_STATE),--state "$(STANDIN_STATE)"))
plan: setup
	url="$$(./scripts/emulator.sh url 2>/dev/null || true)" && \
	    $(PY) scripts/offline_stack.py preview --stack $(STACK) $(STANDIN_STATE_ARG) \
	        $${url:+--server-url "$$url"}

# `pulumi refresh`: read every resource back from Modal into the state, with what drifted and why.
refresh: setup
	url="$$(./scripts/emulator.sh url)" && \
	    $(PY) scripts/offline_stack.py refresh --stack $(STACK) $(STANDIN_STATE_ARG) \
	        --server-url "$$url"

offline-up: setup
	url="$$(./scripts/emulator.sh url)" && \
	    $(PY) scripts/offline_stack.py up --stack $(STACK) --server-url "$$url"

offline-down: setup
	url="$$(./scripts/emulator.sh url)" && \
	    $(PY) scripts/offline_stack.py destroy --stack $(STACK) --server-url "$$url"

gateway-config: setup
	$(PY) scripts/gateway_config.py --stack $(STACK)

# LiteLLM in front of the stack, on 127.0.0.1:$(GATEWAY_PORT), in the background
# (scripts/gateway.sh: pid file beside the gateway file, waits until it answers): its own venv,
# the file gateway-config writes (with the gateway's master key; $GATEWAY_FILE for the local
# stack, as `make up` rewrites it), and the cost map packaged with LiteLLM (no fetch: starts
# offline). Clients send `Authorization: Bearer <master key>` (in the file). `make up` restarts
# a running gateway when it rewrote the file (a rotation); `make down` stops it;
# `make gateway-stop` alone too.
GATEWAY_PORT ?= 4000
gateway: setup $(LITELLM_STAMP)
	GATEWAY_PORT=$(GATEWAY_PORT) ./scripts/gateway.sh start $(STACK)

gateway-stop:
	./scripts/gateway.sh stop $(STACK)

# A review stack's whole life on this machine (docs/review-stacks.md, "Try it locally"): its
# own emulator, the dev stack from a copy of this checkout, PR 42's plan, up and comment, the
# comment's curl, then every stack destroyed, the emulator stopped and .review-demo/ removed.
review-demo: setup
	$(PY) scripts/review_demo.py

# A bad release caught and rolled back while traffic flows (README, "Releases"), on the stack
# `make up` deployed: requests every 0.2 s through the edge, an `up` whose engine crashes at
# start (this run only), the gate's refusal and rollback, then how many requests were answered.
release-demo: setup
	url="$$(./scripts/emulator.sh url)" && \
	    $(PY) scripts/release_demo.py --server-url "$$url" $(if $(STANDIN_STATE),--state "$(STANDIN_STATE)")

# ---- Benchmarks (print a table; compare against a baseline in the same run) ----
bench-proxy: setup
	$(PY) -m bench.proxy

bench-proxy-instructions: setup
	$(PY) -m bench.proxy.instructions

bench-proxy-timeline: setup
	$(PY) -m bench.proxy.timeline

bench-providers: setup
	$(PY) -m bench.providers
