"""One pod's life on the node: network namespace, volumes, containers, probes, status, deletion.

A PodWorker thread owns one pod. It keeps the containers running (restartPolicy Always: a process
that exits, or fails its liveness probe, is restarted and ``restartCount`` grows), probes them
over the pod network the way the kubelet does (httpGet, periodSeconds, failureThreshold,
successThreshold, initialDelaySeconds), re-projects ConfigMap/projected volumes every
``REFRESH_SECONDS`` (atomic swap, volumes.py), writes the pod's status when it changes, and on
deletion stops every process with the pod's grace period, removes the namespace and deletes the
Pod object for good (gracePeriodSeconds 0), as the kubelet does once the containers are gone.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client

from .. import podnet
from . import podman, volumes
from .container import Launcher, UnsupportedImage, stop
from .fields import container_env, resolve_port

log = logging.getLogger("nodeagent")
REFRESH_SECONDS = 2.0
TICK_SECONDS = 0.5


@dataclass
class Probe:
    spec: dict
    started: float
    ok: bool | None = None  # None: not probed yet
    streak: int = 0
    next_at: float = 0.0
    last: bool | None = None  # the previous result, for the success/failure streak

    def due(self, now: float) -> bool:
        return now >= max(self.next_at, self.started + self.spec.get("initialDelaySeconds", 0))


@dataclass
class Running:
    container: dict
    process: subprocess.Popen
    started_at: str
    restarts: int = 0
    readiness: Probe | None = None
    liveness: Probe | None = None
    error: str = ""


def finish_deletion(core: client.CoreV1Api, pod: dict) -> None:
    """Remove the Pod object once nothing of it runs (gracePeriodSeconds 0, only this very pod)."""
    meta = pod["metadata"]
    try:
        # In the body: the API server ignores query parameters when a DeleteOptions body is sent.
        core.delete_namespaced_pod(meta["name"], meta["namespace"], body=client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])))
    except client.ApiException as error:
        if error.status not in (404, 409):
            raise


def container_id(process: subprocess.Popen) -> str:
    """``podman://<container name>`` for a container run from its image, ``process://<pid>`` for a process."""
    if isinstance(process, podman.PodmanRun):
        return f"podman://{process.name}"
    return f"process://{process.pid}"


def http_probe(address: str, container: dict, spec: dict) -> bool:
    get = spec["httpGet"]
    url = f"http://{address}:{resolve_port(container, get['port'])}{get.get('path', '/')}"
    try:
        with urllib.request.urlopen(url, timeout=spec.get("timeoutSeconds", 1)) as response:
            return 200 <= response.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class PodWorker:
    core: client.CoreV1Api
    tokens: volumes.TokenSource
    launcher: Launcher
    pool: podnet.IpPool
    state_dir: Path
    base_env: dict[str, str]
    pod: dict
    running: dict[str, Running] = field(default_factory=dict)
    deleted: threading.Event = field(default_factory=threading.Event)
    gone: threading.Event = field(default_factory=threading.Event)

    @property
    def uid(self) -> str:
        return self.pod["metadata"]["uid"]

    def update(self, pod: dict) -> None:
        self.pod = pod

    def run(self) -> None:
        meta = self.pod["metadata"]
        try:
            self._run()
        except Exception:
            log.exception("pod %s/%s failed", meta["namespace"], meta["name"])
        finally:
            self._teardown()
            self.gone.set()

    def _run(self) -> None:
        address = self.pool.take(self.uid)
        netns = podnet.create_pod_netns(self.uid, address)
        self.pod.setdefault("status", {})["podIP"] = address  # for fieldRefs before the status is written
        paths = self._prepare_volumes()
        if paths is None:
            return
        for container in self.pod["spec"]["containers"]:
            self._start(container, netns, paths, address)
        last_refresh, last_status, api_down = time.monotonic(), None, False
        while not self._deleting():
            now = time.monotonic()
            for run in self.running.values():
                self._supervise(run, netns, paths, address, now)
            try:  # the API server can be away (restarted, unreachable): the containers keep running, as with a kubelet
                if now - last_refresh >= REFRESH_SECONDS:
                    last_refresh = now
                    changed = volumes.refresh(self.core, self.tokens, self.pod, paths)
                    if changed:
                        log.info("pod %s: volumes %s updated", self.pod["metadata"]["name"], changed)
                status = self._status(address)
                if status != last_status:
                    self._write_status(status)
                    last_status = status
                if api_down:
                    log.info("pod %s: API server answers again", self.pod["metadata"]["name"])
                api_down = False
            except (client.ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                if not api_down:
                    log.warning("pod %s: API server unreachable or failing (%s); retrying",
                                self.pod["metadata"]["name"], error)
                api_down = True
            self.deleted.wait(TICK_SECONDS)

    def _prepare_volumes(self) -> dict[str, Path] | None:
        """Retry until every volume's source exists (e.g. kube-root-ca.crt in a brand-new namespace)."""
        while not self._deleting():
            try:
                return volumes.prepare(self.core, self.tokens, self.pod, self.state_dir / "pods" / self.uid / "volumes")
            except client.ApiException as error:
                log.info("pod %s: volumes not ready yet (%s %s)", self.pod["metadata"]["name"], error.status, error.reason)
                self.deleted.wait(1.0)
        return None

    def _deleting(self) -> bool:
        return self.deleted.is_set() or bool(self.pod["metadata"].get("deletionTimestamp"))

    def _start(self, container: dict, netns: str, paths: dict[str, Path], address: str, restarts: int = 0) -> None:
        base = self.launcher.base_env(container, {**self.base_env, "HOSTNAME": self.pod["metadata"]["name"]})
        env = container_env(self.core, self.pod, container, base)
        mounts = [(self._hosts_file(address), "/etc/hosts", True)]
        mounts += [(paths[m["name"]], m["mountPath"], bool(m.get("readOnly"))) for m in container.get("volumeMounts") or []]
        now = time.monotonic()
        try:
            process = self.launcher.start(self.pod, container, netns, mounts, env, restarts)
            error = ""
        except UnsupportedImage as problem:
            process, error = subprocess.Popen(["true"]), str(problem)
        run = Running(container, process, volumes.status_time(), restarts, error=error)
        run.readiness = Probe(container["readinessProbe"], now) if "readinessProbe" in container else None
        run.liveness = Probe(container["livenessProbe"], now) if "livenessProbe" in container else None
        self.running[container["name"]] = run

    def _hosts_file(self, address: str) -> Path:
        """The pod's /etc/hosts, as the kubelet writes one; no cluster DNS runs, so it also names the API server."""
        path = self.state_dir / "pods" / self.uid / "etc-hosts"
        path.write_text(f"127.0.0.1\tlocalhost\n{address}\t{self.pod['metadata']['name']}\n"
                        f"{podnet.GATEWAY}\tkubernetes kubernetes.default kubernetes.default.svc "
                        "kubernetes.default.svc.cluster.local\n")
        path.chmod(0o644)
        return path

    def _supervise(self, run: Running, netns: str, paths: dict[str, Path], address: str, now: float) -> None:
        """Restart an exited or unhealthy container; run the probes that are due."""
        if run.error:
            return
        dead = run.process.poll() is not None
        if not dead and run.liveness and run.liveness.due(now):
            if not self._probe(run.liveness, address, run.container, now):
                log.info("pod %s: %s failed liveness, restarting", self.pod["metadata"]["name"], run.container["name"])
                stop(run.process, self.pod["spec"].get("terminationGracePeriodSeconds", 30))
                dead = True
        if dead:
            self._start(run.container, netns, paths, address, run.restarts + 1)
            return
        if run.readiness and run.readiness.due(now):
            self._probe(run.readiness, address, run.container, now)

    @staticmethod
    def _probe(probe: Probe, address: str, container: dict, now: float) -> bool:
        """One probe. The verdict turns after successThreshold successes / failureThreshold failures in a row;
        returns whether the probe passes now (before any verdict: liveness passes, readiness does not)."""
        success = http_probe(address, container, probe.spec)
        probe.next_at = now + probe.spec.get("periodSeconds", 10)
        probe.streak = probe.streak + 1 if probe.last == success else 1
        probe.last = success
        threshold = probe.spec.get("successThreshold", 1) if success else probe.spec.get("failureThreshold", 3)
        if probe.streak >= threshold:
            probe.ok = success
        return probe.ok is not False

    def _status(self, address: str) -> dict:
        statuses = []
        for name, run in self.running.items():
            ready = run.process.poll() is None and not run.error and (run.readiness is None or bool(run.readiness.ok))
            state = ({"waiting": {"reason": "UnsupportedImage", "message": run.error}} if run.error
                     else {"running": {"startedAt": run.started_at}})
            statuses.append({"name": name, "image": run.container["image"], "imageID": "", "ready": ready,
                             "started": not run.error, "restartCount": run.restarts, "state": state,
                             "containerID": container_id(run.process)})
            if isinstance(run.process, podman.PodmanRun):
                statuses[-1]["imageID"] = run.process.image_id
        all_ready = all(s["ready"] for s in statuses)
        return {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}], "hostIP": podnet.GATEWAY,
                "containerStatuses": statuses, "ready": all_ready}

    def _write_status(self, status: dict) -> None:
        now = volumes.status_time()
        status = dict(status)
        ready = "True" if status.pop("ready") else "False"
        conditions = [{"type": kind, "status": value, "lastTransitionTime": now} for kind, value in
                      (("Initialized", "True"), ("PodScheduled", "True"), ("ContainersReady", ready), ("Ready", ready))]
        known = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}
        for condition in conditions:  # keep the transition time of a condition that did not change
            if known.get(condition["type"], {}).get("status") == condition["status"]:
                condition["lastTransitionTime"] = known[condition["type"]].get("lastTransitionTime") or now
        body = {"status": {**status, "conditions": conditions, "startTime": (self.pod.get("status") or {}).get("startTime") or now}}
        meta = self.pod["metadata"]
        try:
            answer = self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
            self.pod["status"] = volumes.as_dict(answer).get("status") or self.pod["status"]
        except client.ApiException as error:
            if error.status != 404:
                raise

    def _teardown(self) -> None:
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        threads = [threading.Thread(target=stop, args=(run.process, grace)) for run in self.running.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        podnet.delete_pod_netns(self.uid)
        self.pool.give_back(self.uid)
        self.tokens.forget(self.uid)
        if self.pod["metadata"].get("deletionTimestamp"):
            finish_deletion(self.core, self.pod)
