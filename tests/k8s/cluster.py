"""The `cluster` fixture: the emulator, or the real cluster named by KUBECONFIG.

Tests talk to it only through the ``kubernetes`` client and a kubeconfig file,
so the same test runs unchanged against both. Import the fixture into a test
module with ``from k8s.cluster import cluster  # noqa: F401``.
"""
from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import kmock
import kubernetes
import pytest
import yaml

from rollout_router_operator.crd import crd_manifest

from .emulator import Emulator, EmulatorServer
from .resources import load_bundled

GROUP, VERSION, PLURAL = "rolloutrouter.dev", "v1alpha1", "rolloutrouters"


@dataclasses.dataclass
class Cluster:
    kubeconfig: Path
    namespace: str
    api: kubernetes.client.ApiClient
    emulated: bool
    emulator: Emulator | None = None  # the emulator itself (its request log, ``compact()``); None on a real cluster

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)

    @property
    def apps(self) -> kubernetes.client.AppsV1Api:
        return kubernetes.client.AppsV1Api(self.api)

    @property
    def custom(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.api)

    def get_rr(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def patch_rr(self, name: str, spec: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})


def emulated_resources(emulator: Emulator) -> None:
    """Built-ins from kmock's bundle, RolloutRouter from our own CRD."""
    load_bundled(emulator)
    crd = crd_manifest()
    names = crd["spec"]["names"]
    version = crd["spec"]["versions"][0]
    emulator.resources[f"{crd['spec']['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
        namespaced=True, kind=names["kind"], singular=names["singular"], shortnames=set(names["shortNames"]),
        subresources=set(version.get("subresources", {})),
        verbs={"create", "delete", "get", "list", "patch", "update", "watch"})


def write_kubeconfig(path: Path, server: str, token: str = "emulator") -> None:
    """A kubeconfig for the emulator at ``server``; the token tells the emulator's fault hook who is asking."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
    }))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A namespace on an API server; with KUBECONFIG set, a fresh namespace on that cluster (CRD applied)."""
    namespace = f"rr-test-{uuid.uuid4().hex[:6]}"
    if os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"])
        api = kubernetes.config.new_client_from_config(str(kubeconfig))
        ext = kubernetes.client.ApiextensionsV1Api(api)
        crd = crd_manifest()
        ext.patch_custom_resource_definition(crd["metadata"]["name"], crd, field_manager="rollout-router-tests",
                                             force=True, _content_type="application/apply-patch+yaml")
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        try:
            yield Cluster(kubeconfig, namespace, api, emulated=False)
        finally:
            kubernetes.client.CoreV1Api(api).delete_namespace(namespace)
        return
    emulator = Emulator(namespaces={namespace})
    emulated_resources(emulator)
    server = EmulatorServer(emulator).start()
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    write_kubeconfig(kubeconfig, server.url)
    api = kubernetes.config.new_client_from_config(str(kubeconfig))
    try:
        yield Cluster(kubeconfig, namespace, api, emulated=True, emulator=emulator)
    finally:
        api.close()
        server.stop()
