# syntax=docker/dockerfile:1
# Two images, each installing only what it runs (neither carries the simulator's numpy/matplotlib):
#   the router, `rollout-router serve` on the core install (the default target):
#     docker build -t ghcr.io/rolloutrouter/rollout-router:0.1.0 .
#   the operator, `rollout-router operator` with the [operator] extra (kopf):
#     docker build --target operator -t ghcr.io/rolloutrouter/rollout-router-operator:0.1.0 .
# The tags are the ones the Helm chart (charts/rollout-router: image.repository for the operator,
# routerImage.repository for the router pods, tags from appVersion) and the operator's default router
# image (operator/rollout_router_operator/spec.py DEFAULT_IMAGE) name.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the sources, a C compiler for the native HTTP lane (hatch_build.py), a virtualenv with a current pip ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# gcc, and Python's headers where the base has none (a Debian python3; the python images carry theirs)
RUN apt-get update -qq \
 && headers="$(python3 -c 'import sysconfig, os; print(os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))')" \
 && apt-get install -y -qq --no-install-recommends gcc libc6-dev $([ "$headers" = True ] || echo python3-dev) >/dev/null \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/rollout-router
ENV PATH=/opt/rollout-router/bin:$PATH
RUN pip install --upgrade pip
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY router/ router/
COPY operator/ operator/

# --- the router's virtualenv: the core install, non-editable; no pip or setuptools at run time ---
FROM build AS build-router
RUN pip install . \
 && pip uninstall -y pip setuptools \
 && python -c 'import sys; from rollout_router.proxy.http.lane import unavailable; sys.exit(unavailable())' \
 && rollout-router serve --help >/dev/null \
 && rollout-router fake-vllm --help >/dev/null

# --- the operator's virtualenv: the core install and the [operator] extra ---
FROM build AS build-operator
RUN pip install '.[operator]' \
 && pip uninstall -y pip setuptools \
 && rollout-router operator --help >/dev/null

# --- what both images share: the slim base and a non-root user; no compilers, no pip, no sources ---
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/rolloutrouter/rollout-router" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the "nonroot" uid/gid the operator's router pods and the chart run as.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin nonroot
ENV PATH=/opt/rollout-router/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
ENTRYPOINT ["rollout-router"]

# --- the operator image (`--target operator`) ---
FROM runtime AS operator
LABEL org.opencontainers.image.title="rollout-router-operator" \
      org.opencontainers.image.description="Kubernetes operator for RolloutRouter resources"
COPY --from=build-operator /opt/rollout-router /opt/rollout-router
USER 65532:65532
# 8080: the operator's metrics; 8081: its liveness endpoint (the chart passes --liveness).
EXPOSE 8080 8081
CMD ["operator"]

# --- the router image (the default target) ---
FROM runtime AS router
LABEL org.opencontainers.image.title="rollout-router" \
      org.opencontainers.image.description="Session-affinity router for vLLM fleets"
COPY --from=build-router /opt/rollout-router /opt/rollout-router
USER 65532:65532
# 8080: the router's traffic, /metrics and /status; 50051: its gRPC listener, when the replicas serve gRPC.
EXPOSE 8080 50051
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
