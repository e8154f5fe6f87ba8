"""The node agent: a stand-in for the kubelet and the container runtime, for the k8s test tier.

    python -m tests.realk8s.nodeagent --kubeconfig K --node-name N --state-dir D --bin-dir VENV/bin

It registers a Node (Ready, with capacity, address = the pod network's gateway) and keeps its
Ready condition's heartbeat fresh, lists and watches the pods the scheduler bound to it
(fieldSelector spec.nodeName) and gives each one a PodWorker thread (pod.py). Authenticates with
the kubeconfig it is given (the admin one in the tests; a real kubelet has a node identity).
Runs as root: it creates network namespaces and mounts.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch

from .. import podnet, runtime
from . import volumes
from .container import Launcher, image_identity_files, usable_uids
from .pod import PodWorker, finish_deletion

log = logging.getLogger("nodeagent")
HEARTBEAT_SECONDS = 10
NONROOT_UIDS = {65532}  # the image's user; tried once at start (see container.usable_uids)


def node_body(name: str) -> dict:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                   "kubernetes.io/arch": "amd64"}},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "addresses": [{"type": "InternalIP", "address": podnet.GATEWAY},
                                     {"type": "Hostname", "address": name}],
                       "nodeInfo": {"kubeletVersion": "rollout-router-nodeagent", "kubeProxyVersion": "",
                                    "operatingSystem": "linux", "architecture": "amd64", "osImage": "local processes",
                                    "kernelVersion": os.uname().release, "containerRuntimeVersion": "process://local",
                                    "bootID": "", "machineID": "", "systemUUID": ""}}}


def ready_condition() -> dict:
    now = volumes.status_time()
    return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "node agent is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now}


class Agent:
    def __init__(self, core: client.CoreV1Api, node: str, state_dir: Path, launcher: Launcher,
                 base_env: dict[str, str]) -> None:
        self.core, self.node, self.state_dir = core, node, state_dir
        self.launcher, self.base_env = launcher, base_env
        self.tokens = volumes.TokenSource(core)
        self.pool = podnet.IpPool()
        self.workers: dict[str, PodWorker] = {}

    def register(self) -> None:
        body = node_body(self.node)
        try:
            self.core.create_node(body)
        except client.ApiException as error:
            if error.status != 409:
                raise
        self.heartbeat()
        # The API server taints every new node not-ready; with no node lifecycle controller running
        # (controlplane.py), the agent lifts that taint itself once it has reported Ready.
        taints = self.core.read_node(self.node).spec.taints or []
        kept = [volumes.as_dict(t) for t in taints if t.key != "node.kubernetes.io/not-ready"]
        if len(kept) != len(taints):
            self.core.patch_node(self.node, {"spec": {"taints": kept or None}})

    def heartbeat(self) -> None:
        status = {**node_body(self.node)["status"], "conditions": [ready_condition()]}
        self.core.patch_node_status(self.node, {"status": status})

    def heartbeats(self) -> None:
        while True:
            time.sleep(HEARTBEAT_SECONDS)
            try:
                self.heartbeat()
            except Exception:
                log.exception("heartbeat failed")

    def handle(self, kind: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        log.debug("event %s pod %s deleting=%s", kind, pod["metadata"]["name"], pod["metadata"].get("deletionTimestamp"))
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker:
                worker.update(pod)
                worker.deleted.set()
            return
        if worker is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            if pod["metadata"].get("deletionTimestamp"):  # nothing runs for it here: finish the deletion
                finish_deletion(self.core, pod)
                return
            worker = PodWorker(self.core, self.tokens, self.launcher, self.pool, self.state_dir, self.base_env, pod)
            self.workers[uid] = worker
            threading.Thread(target=worker.run, name=f"pod-{pod['metadata']['name']}", daemon=True).start()
            log.info("pod %s/%s: starting", pod["metadata"]["namespace"], pod["metadata"]["name"])
        else:
            worker.update(pod)
        self.workers = {u: w for u, w in self.workers.items() if not w.gone.is_set()}

    def sync(self) -> None:
        """List, hand every pod to its worker, stop workers of pods that are gone, then watch."""
        selector = f"spec.nodeName={self.node}"
        listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
        present = set()
        for item in listed.items:
            pod = volumes.as_dict(item)
            present.add(pod["metadata"]["uid"])
            self.handle("ADDED", pod)
        for uid, worker in list(self.workers.items()):
            if uid not in present:
                worker.deleted.set()
        stream = watch.Watch().stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                      resource_version=listed.metadata.resource_version, timeout_seconds=60)
        for event in stream:
            self.handle(event["type"], volumes.as_dict(event["object"]))

    def run(self) -> None:
        self.register()
        threading.Thread(target=self.heartbeats, name="heartbeat", daemon=True).start()
        try:
            while True:
                try:
                    self.sync()
                except Exception:
                    log.exception("pod watch failed; relisting")
                    time.sleep(1)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop every pod's processes (with its grace period) and remove its namespace."""
        for worker in self.workers.values():
            worker.deleted.set()
        for worker in self.workers.values():
            worker.gone.wait(60)
        self.launcher.remove_mountpoints()


def main() -> None:
    parser = argparse.ArgumentParser(prog="nodeagent", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", default="node-1")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--bin-dir", type=Path, required=True, help="the virtualenv's bin (rollout-router, python)")
    parser.add_argument("--api-port", type=int, required=True, help="the API server's port on the gateway")
    parser.add_argument("--runtime", choices=("podman", "processes"), default="processes",
                        help="podman: the project's images run from their images (tests/realk8s/runtime.py)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.DEBUG if os.environ.get('NODEAGENT_DEBUG') else logging.INFO, format="%(asctime)s %(threadName)s %(levelname)s %(message)s")
    (args.state_dir / "logs").mkdir(parents=True, exist_ok=True)
    uids = usable_uids(NONROOT_UIDS, args.bin_dir / "python")
    log.info("container processes may run as uids %s (others run as root)", sorted(uids))
    launcher = Launcher(args.bin_dir, args.state_dir / "logs", uids, image_identity_files(args.state_dir),
                        use_podman=args.runtime == "podman")
    if launcher.use_podman:
        runtime.remove_leftover_containers()
    log.info("runtime: %s", args.runtime)
    base_env = {"PATH": f"{args.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp",
                "KUBERNETES_SERVICE_HOST": podnet.GATEWAY, "KUBERNETES_SERVICE_PORT": str(args.api_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(args.api_port)}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds run() into shutdown()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` dumps every thread's stack to the log
    core = client.CoreV1Api(config.new_client_from_config(str(args.kubeconfig)))
    Agent(core, args.node_name, args.state_dir, launcher, base_env).run()


if __name__ == "__main__":
    main()
