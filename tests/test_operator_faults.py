"""The operator under API faults, as real processes: the emulator answers 500/503/429/409, or nothing
at all for a while, and cuts watches; every handler and the status refresh carry on afterwards.

Each test has its own emulator and operator. The operator's kubeconfig carries its own token, so
faults hit only its requests while the test keeps reading and changing objects.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from rollout_router.localfleet import free_port
from rollout_router_operator.render import child_refs
from tests.k8s.cluster import GROUP, PLURAL, VERSION, Cluster, emulated_resources, write_kubeconfig
from tests.k8s.emulator import Emulator, EmulatorServer
from tests.k8s.faults import Faults
from tests.k8s.resources import object_path
from tests.k8s.stack import default_children
from tests.support import wait_until

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))
NAME = "flaky"
ALWAYS = {kind for _, kind, _ in default_children(NAME)}  # 1 replica, no policy, no monitor, ClusterIP


@dataclass
class Faulty:
    cluster: Cluster
    server: EmulatorServer
    faults: Faults
    operator: subprocess.Popen
    log: Path

    def rr(self, name: str = NAME) -> dict:
        return self.cluster.get_rr(name)

    def read_at(self, name: str = NAME) -> str | None:
        return (self.rr(name).get("status") or {}).get("affinity", {}).get("readAt")

    def children(self, name: str = NAME) -> dict[str, dict]:
        """Every child of ``name`` that exists, by kind."""
        found = {}
        for api_version, kind, child in child_refs(name):
            body = get_object(self.cluster, api_version, kind, child)
            if body is not None:
                found[kind] = body
        return found

    def create(self, name: str = NAME, margin: int | None = None) -> None:
        c = self.cluster
        c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMargin": margin}})


def get_object(c: Cluster, api_version: str, kind: str, name: str) -> dict | None:
    response = c.api.call_api(*c.api.param_serialize("GET", object_path(api_version, kind, c.namespace, name),
                                                     auth_settings=["BearerToken"]))
    response.read()
    return json.loads(response.data) if response.status == 200 else None


def wait_for(check: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    return wait_until(check, what, timeout)


def refreshing(faulty: Faulty, name: str = NAME, times: int = 2) -> None:
    """The status refresh is alive: readAt (one-second resolution) moves ``times`` more times."""
    for _ in range(times):
        before = faulty.read_at(name)
        wait_for(lambda: faulty.read_at(name) not in (None, before), f"the status of {name} to be refreshed", 20)


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[Faulty]:
    namespace = f"rr-faults-{uuid.uuid4().hex[:6]}"
    faults = Faults()
    emulator = Emulator(namespaces={namespace}, fault=faults)
    emulated_resources(emulator)
    server = EmulatorServer(emulator).start()
    write_kubeconfig(tmp_path / "test-config", server.url)
    write_kubeconfig(tmp_path / "operator-config", server.url, token=faults.token)
    api = kubernetes.config.new_client_from_config(str(tmp_path / "test-config"))
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "operator-config")}
    operator = subprocess.Popen(
        [SCRIPT, "operator", "--namespace", namespace, "--status-interval", "0.5", "--metrics-host", "127.0.0.1",
         "--metrics-port", str(free_port("127.0.0.1"))], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        yield Faulty(Cluster(tmp_path / "test-config", namespace, api, emulated=True, emulator=emulator),
                     server, faults, operator, log)
        assert operator.poll() is None, "the operator exited:\n" + log.read_text()[-3000:]
    finally:
        operator.terminate()
        try:
            operator.wait(10)
        except subprocess.TimeoutExpired:
            operator.kill()
        api.close()
        server.stop()


def test_one_request_in_five_failing_loses_and_duplicates_nothing(faulty: Faulty):
    """500/503/429 anywhere and 409 on our writes, one request in five: create, update, refresh and
    delete all complete, each child exists once, and deletion never deletes a child twice."""
    faulty.faults.rate = 0.2
    faulty.create()
    wait_for(lambda: set(faulty.children()) == ALWAYS, "every child", 60)
    refreshing(faulty)
    faulty.cluster.patch_rr(NAME, {"affinityBreakMargin": 3})
    wait_for(lambda: "affinityBreakMargin: 3" in faulty.children()["ConfigMap"]["data"]["config.yaml"],
             "the update to reach the ConfigMap", 60)
    wait_for(lambda: faulty.rr()["status"].get("observedGeneration") == 2, "observedGeneration 2", 30)
    refreshing(faulty)
    c = faulty.cluster
    for api_version, kind, name in default_children(NAME):  # none written twice
        items = c.api.call_api(*c.api.param_serialize("GET", object_path(api_version, kind, c.namespace),
                                                      auth_settings=["BearerToken"]))
        items.read()
        assert [i["metadata"]["name"] for i in json.loads(items.data)["items"]
                if i["metadata"]["name"].startswith(NAME)] == [name], kind
    assert faulty.rr()["metadata"]["finalizers"] == ["rolloutrouter.dev/children"]
    c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, NAME)
    wait_for(lambda: faulty.children() == {} and _gone(faulty), "the children and the resource to go", 60)
    # Absent optional children (PDB, NetworkPolicy) are deleted-if-present on every reconcile; the ones
    # that existed must each be deleted once, not again after another child's delete failed.
    existed = {f"{object_path(v, kind, c.namespace)}/{name}" for v, kind, name in default_children(NAME)}
    redeleted = {path: n for path, n in faulty.faults.redeleted.items() if path in existed}
    assert not redeleted, f"deletion restarted its list after a failure: {redeleted}"
    assert sum(faulty.faults.injected.values()) >= 10 and faulty.faults.injected[409] >= 1, faulty.faults.injected


def _gone(faulty: Faulty) -> bool:
    try:
        faulty.rr()
    except ApiException as error:
        return error.status == 404
    return False


def test_a_conflict_on_the_status_patch_does_not_end_the_refresh(faulty: Faulty):
    """Seen: one status patch answered 409 ended kopf's timer for good, and `kubectl get rr` froze."""
    faulty.create()
    refreshing(faulty)
    faulty.faults.status_conflicts = True
    wait_for(lambda: faulty.faults.injected[409] >= 3, "status patches to meet conflicts")
    faulty.faults.status_conflicts = False
    refreshing(faulty, times=3)


def test_an_outage_with_dropped_watches_is_waited_out(faulty: Faulty):
    """Every operator request answered 503 and every watch cut for a while: changes made meanwhile
    (a spec update, a new resource) are applied once the API answers again, and the refresh resumes."""
    faulty.create()
    wait_for(lambda: "Deployment" in faulty.children(), "the Deployment")
    refreshing(faulty)
    faulty.faults.outage = True
    faulty.server.drop_watches()
    faulty.cluster.patch_rr(NAME, {"affinityBreakMargin": 5})
    faulty.create("second")
    wait_for(lambda: faulty.faults.injected[503] >= 10, "the operator to meet the outage")
    time.sleep(8)  # the outage lasts: kopf's backoffs grow (1, 2, 5 s) while every attempt fails
    assert faulty.operator.poll() is None, "the operator gave up during the outage"
    assert "Deployment" not in faulty.children("second")
    faulty.faults.outage = False
    wait_for(lambda: "affinityBreakMargin: 5" in faulty.children()["ConfigMap"]["data"]["config.yaml"],
             "the update made during the outage", 60)
    wait_for(lambda: "Deployment" in faulty.children("second"), "the resource created during the outage", 60)
    refreshing(faulty)
    refreshing(faulty, "second")


def test_a_resource_whose_status_is_null_is_reconciled(faulty: Faulty):
    """Seen: a reconcile failed on ``dict(body.status)`` with 'NoneType' object is not iterable."""
    faulty.create()
    wait_for(lambda: faulty.rr().get("status", {}).get("observedGeneration") == 1, "the first status")
    faulty.faults.outage = True  # hold the operator off while the status is emptied and the spec changed
    faulty.server.drop_watches()
    c = faulty.cluster
    c.custom.patch_namespaced_custom_object_status(GROUP, VERSION, c.namespace, PLURAL, NAME, {"status": None})
    assert "status" not in faulty.rr()
    faulty.cluster.patch_rr(NAME, {"affinityBreakMargin": 7})
    faulty.faults.outage = False
    wait_for(lambda: faulty.rr().get("status", {}).get("observedGeneration") == 2, "the status written again", 60)
    assert "'NoneType' object is not iterable" not in faulty.log.read_text()


def test_a_reconcile_that_cannot_list_pods_applies_its_children_and_says_why_in_one_line(faulty: Faulty):
    """Seen: a 403 listing pods (RBAC) after an update's children were applied ended the reconcile in a
    traceback. Now the children stand, the failure is one counted warning, and the status follows once pods list."""
    faulty.create()
    wait_for(lambda: faulty.rr().get("status", {}).get("observedGeneration") == 1, "the first status")
    faulty.faults.pods_forbidden = True
    faulty.cluster.patch_rr(NAME, {"affinityBreakMargin": 4})
    wait_for(lambda: "affinityBreakMargin: 4" in faulty.children()["ConfigMap"]["data"]["config.yaml"],
             "the update to reach the ConfigMap")
    wait_for(lambda: "Updating is processed: 1 succeeded" in faulty.log.read_text(), "the update's reconcile to end")
    assert faulty.faults.injected[403] >= 1
    assert "Traceback" not in faulty.log.read_text()
    assert re.search(r"status poll failed, the status timer tries again within [0-9.]+s: .*403", faulty.log.read_text())
    assert faulty.rr()["status"]["observedGeneration"] == 1
    faulty.faults.pods_forbidden = False
    wait_for(lambda: faulty.rr()["status"].get("observedGeneration") == 2, "the status once pods list again")
    assert "Traceback" not in faulty.log.read_text()
