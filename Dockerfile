# syntax=docker/dockerfile:1
# One image for both `rollout-router serve` (router pods) and `rollout-router operator`.
#   docker build -t ghcr.io/rolloutrouter/rollout-router:0.1.0 .
# The tag is the one the Helm chart (charts/rollout-router, image.repository + appVersion)
# and the operator's default router image (operator/rollout_router_operator/spec.py DEFAULT_IMAGE) name.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: resolve and install the package and its dependencies into a virtualenv ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/rollout-router
ENV PATH=/opt/rollout-router/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router/ router/
COPY operator/ operator/
# A regular (non-editable) install: the final stage copies only the virtualenv.
RUN pip install --upgrade pip \
 && pip install . \
 && pip uninstall -y pip \
 && rollout-router --help >/dev/null

# --- final: the slim base, the virtualenv, a non-root user; no compilers, no pip, no sources ---
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="rollout-router" \
      org.opencontainers.image.description="Session-affinity router for vLLM fleets, and its Kubernetes operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/rolloutrouter/rollout-router" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the "nonroot" uid/gid the operator's router pods and the chart run as.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin nonroot
COPY --from=build /opt/rollout-router /opt/rollout-router
ENV PATH=/opt/rollout-router/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
WORKDIR /tmp
# 8080: the router's traffic, /metrics and /status (or the operator's metrics); 8081: the operator's
# liveness endpoint; 50051: the router's gRPC listener, when the replicas serve gRPC.
EXPOSE 8080 8081 50051
ENTRYPOINT ["rollout-router"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
