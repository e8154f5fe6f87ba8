"""The real-Kubernetes tier is opt-in: ``ROLLOUT_ROUTER_REAL_K8S=1`` (``make test-k8s`` sets it).

Its prerequisites are root and the binaries build.sh makes (tests/opt_in.py: without the variable nothing here
is collected, so ``make test`` needs no Go; with it, a missing prerequisite fails the run at collection).

One control plane per session (cluster.py): etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built by build.sh, plus our node agent standing in for the kubelet. The chart is
installed once per session with the real ``helm``; each test works in its own namespace.
"""
from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.opt_in import OptInTier

TIER = OptInTier("ROLLOUT_ROUTER_REAL_K8S", "realk8s", "runs against a real Kubernetes control plane")
ENV, enabled = TIER.env, TIER.enabled
ROOT = Path(__file__).resolve().parents[2]
_NAMESPACES = itertools.count(1)
RUNTIME = pytest.StashKey["object"]()  # runtime.Runtime, decided once per run
BEFORE_HELM = "before_helm"  # the marker of tests that run before the Helm release exists (ordered first below)
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm")


def bin_dir() -> Path:
    return Path(os.environ.get("REALK8S_BIN", ""))


def missing_prerequisites() -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (the node agent creates network namespaces and mounts)")
    if not os.environ.get("REALK8S_BIN"):
        problems.append("REALK8S_BIN is not set (the directory build.sh prints)")
    else:
        problems += [f"{bin_dir() / name} missing" for name in BINARIES if not (bin_dir() / name).exists()]
    return problems


def pytest_configure(config: pytest.Config) -> None:
    TIER.configure(config)
    config.addinivalue_line("markers", f"{BEFORE_HELM}: runs first, on a cluster without the session's Helm release "
                                       "(it installs the operator its own way and removes it again)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return TIER.ignore(collection_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a tier that cannot run; put the tests marked ``before_helm`` first (a stable sort keeps the rest in
    order): the session's Helm release (``operator_release``) would hold the names they install, and once a test
    asks for it, it stays until the session ends."""
    if enabled():
        TIER.refuse("the k8s tier", missing_prerequisites(),
                    "Run it with `make test-k8s` (as root; it builds the components first).")
        items.sort(key=lambda item: item.get_closest_marker(BEFORE_HELM) is None)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """The runtime, first thing in the output: podman from the images, or the processes fallback and why."""
    if not enabled():
        return None
    from .runtime import detect

    config.stash[RUNTIME] = detect()
    return [config.stash[RUNTIME].describe()]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if enabled() and RUNTIME in config.stash:
        terminalreporter.write_sep("-", config.stash[RUNTIME].describe())


@pytest.fixture(scope="session")
def runtime(pytestconfig: pytest.Config):
    from .runtime import detect

    if RUNTIME not in pytestconfig.stash:
        pytestconfig.stash[RUNTIME] = detect()
    return pytestconfig.stash[RUNTIME]


@pytest.fixture(autouse=True)
def _report_runtime(request: pytest.FixtureRequest, runtime) -> None:
    """Each test's report says which runtime ran its pods (a junit-xml property)."""
    request.node.user_properties.append(("runtime", runtime.name))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, runtime) -> Iterator:
    from .cluster import Cluster

    with Cluster.running(tmp_path_factory.mktemp("realk8s"), bin_dir(), ROOT, runtime) as running:
        yield running


@pytest.fixture(scope="session")
def operator_release(cluster) -> Iterator[str]:
    """The chart installed as the README says (every namespace: each test has its own); yields the release namespace."""
    namespace = "rollout-router-system"
    cluster.helm("install", "rollout-router", str(ROOT / "charts/rollout-router"), "-n", namespace,
                 "--create-namespace", "--set", "operator.watchAllNamespaces=true",
                 "--set", "operator.statusInterval=2", "--wait", "--timeout", "180s")
    yield namespace
    cluster.helm("uninstall", "rollout-router", "-n", namespace, "--wait", check=False)


@pytest.fixture
def namespace(cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (its pods are stopped by the node agent)."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())
    name = f"t{next(_NAMESPACES)}-{words[:40]}".strip("-")  # unique: a deleted namespace lingers while it empties
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
