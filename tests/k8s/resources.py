"""Built-in kinds as an API server describes them, for tests that have no server to ask.

The operator reads plurals from the API's discovery documents at run time;
tests without a cluster read the same documents from kmock's bundle (a
snapshot of a real server's discovery).
"""
from __future__ import annotations

import functools
import warnings

import kmock

from rollout_router.kube.resources import Resource


def load_bundled(emulator: kmock.KubernetesEmulator) -> None:
    """Every built-in kind, as kmock's bundle describes it."""
    with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        emulator.resources.load_bundled()


@functools.cache
def _bundled() -> dict[tuple[str, str], Resource]:
    emulator = kmock.KubernetesEmulator()
    load_bundled(emulator)
    found = {}
    for ref, info in emulator.resources.items():
        api_version = f"{ref.group}/{ref.version}" if ref.group else ref.version
        found[api_version, info.kind] = Resource(api_version, info.kind, ref.plural, bool(info.namespaced))
    return found


# Kinds of other projects' CRDs the operator may write, as their CRDs declare them (not in kmock's bundle).
SERVICE_MONITOR = Resource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", True)  # Prometheus Operator


def resource_of(api_version: str, kind: str) -> Resource:
    if (api_version, kind) == (SERVICE_MONITOR.api_version, SERVICE_MONITOR.kind):
        return SERVICE_MONITOR
    return _bundled()[api_version, kind]


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The URL path of a built-in object (or its collection), e.g. ``/apis/apps/v1/namespaces/ns/deployments/x``."""
    return resource_of(api_version, kind).path(namespace, name)
