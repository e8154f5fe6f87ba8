"""The session's cluster: control plane + node agent, and the CLIs a user types (kubectl, helm)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from . import podnet, runtime
from .controlplane import ControlPlane

T = TypeVar("T")
NODE = "node-1"


def eventually(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last answer."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (subprocess.CalledProcessError, OSError, KeyError, IndexError, ValueError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


class CommandFailed(subprocess.CalledProcessError):
    """A kubectl/helm failure whose message carries what the tool printed."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"


@dataclass
class Cluster:
    directory: Path
    bin_dir: Path
    root: Path
    plane: ControlPlane
    runtime: runtime.Runtime
    agent: subprocess.Popen | None = None

    @classmethod
    @contextlib.contextmanager
    def running(cls, directory: Path, bin_dir: Path, root: Path, kind: runtime.Runtime) -> Iterator[Cluster]:
        podnet.bridge_up()
        plane = ControlPlane(directory / "controlplane", bin_dir)
        plane.directory.mkdir(parents=True)
        cluster = cls(directory, bin_dir, root, plane, kind)
        try:
            plane.start()
            cluster.start_agent()
            yield cluster
        finally:
            cluster.stop_agent()
            plane.stop()
            if kind.name == "podman":
                runtime.remove_leftover_containers()
            for ns in podnet.leftover_namespaces():
                subprocess.run(["ip", "netns", "del", ns], check=False)
            podnet.bridge_down()

    # --- the node agent -------------------------------------------------------------------------
    def start_agent(self) -> None:
        log = open(self.directory / "nodeagent.log", "wb")
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "tests.realk8s.nodeagent", "--kubeconfig", str(self.plane.kubeconfig),
             "--node-name", NODE, "--state-dir", str(self.directory / "node"), "--bin-dir", str(Path(sys.executable).parent),
             "--api-port", str(self.plane.api_port), "--runtime", self.runtime.name],
            cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        eventually(lambda: self.node_ready(), 60, "node registered and Ready")

    def node_ready(self) -> bool:
        if self.agent and self.agent.poll() is not None:
            raise RuntimeError(f"node agent exited: {(self.directory / 'nodeagent.log').read_text()[-3000:]}")
        node = self.get("node", NODE)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def stop_agent(self) -> None:
        """SIGTERM: the agent stops every pod's processes (with their grace periods) before exiting."""
        if self.agent and self.agent.poll() is None:
            os.killpg(self.agent.pid, signal.SIGTERM)
            try:
                self.agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.agent.pid, signal.SIGKILL)
                self.agent.wait()

    # --- what a user types --------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        helm_home = self.directory / "helm"
        return {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HELM_CACHE_HOME": str(helm_home / "cache"),
                "HELM_CONFIG_HOME": str(helm_home / "config"), "HELM_DATA_HOME": str(helm_home / "data")}

    def run(self, tool: str, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        answer = subprocess.run([str(self.bin_dir / tool), *args], env=self.env(), input=stdin, capture_output=True,
                                text=True, timeout=300, cwd=self.root)
        if check and answer.returncode != 0:
            raise CommandFailed(answer.returncode, [tool, *args], answer.stdout, answer.stderr)
        return answer

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        return self.run("kubectl", *args, check=check, stdin=stdin)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("helm", *args, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: str | dict, namespace: str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-n", namespace, "-f", "-", stdin=text)

    # --- waiting for what controllers do ------------------------------------------------------------
    def ready_pods(self, namespace: str, selector: str) -> list[dict]:
        pods = self.get("pods", "-n", namespace, "-l", selector)["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))]

    def wait_ready_pods(self, namespace: str, selector: str, count: int, timeout: float = 120) -> list[dict]:
        return eventually(lambda: (lambda pods: pods if len(pods) == count else None)(self.ready_pods(namespace, selector)),
                          timeout, f"{count} ready pods {selector} in {namespace}")

    def agent_file(self, pod: dict, volume: str, name: str) -> Path:
        """A file of a pod's volume as the node agent projected it (e.g. the ServiceAccount token)."""
        return self.directory / "node" / "pods" / pod["metadata"]["uid"] / "volumes" / volume / name

    def pod_log(self, pod: dict, container: str) -> str:
        meta = pod["metadata"]
        return (self.directory / "node" / "logs" / f"{meta['namespace']}_{meta['name']}_{container}.log").read_text()
