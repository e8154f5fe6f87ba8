"""A real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Built by build.sh from the pinned Go modules; started here as processes on this machine with
certificates from pki.py, in one temporary directory, stopped in reverse order. etcd and the
controllers listen on 127.0.0.1; the API server listens on the pod network's gateway address
(podnet.GATEWAY) so pods reach it, and the host reaches it there too.
"""
from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rollout_router.localfleet import free_port

from . import podnet
from .pki import Pki, kubeconfig, make_pki

SERVICE_CIDR = "10.96.0.0/24"
# 443, the port of the `kubernetes` Service: in-cluster clients that use https://kubernetes.default.svc
# (kopf does) reach it through the pods' /etc/hosts (nodeagent/pod.py); no kube-proxy runs.
API_PORT = 443
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass
class ControlPlane:
    directory: Path
    bin_dir: Path
    pki: Pki | None = None
    api_port: int = 0
    kubeconfig: Path | None = None
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    arguments: dict[str, list[str]] = field(default_factory=dict)  # each component's flags, to restart it

    @property
    def server(self) -> str:
        return f"https://{podnet.GATEWAY}:{self.api_port}"

    def start(self) -> None:
        self.pki = make_pki(self.directory / "pki", [podnet.GATEWAY, "127.0.0.1", "10.96.0.1"])
        self.api_port = API_PORT
        self.kubeconfig = kubeconfig(self.directory / "admin.kubeconfig", self.server, self.pki)
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        self._start_controller_manager()
        self._start_scheduler()

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")
        process = subprocess.Popen([str(self.bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes = [(n, p) for n, p in self.processes if n != name] + [(name, process)]
        self.arguments[name] = args
        return process

    def process(self, name: str) -> subprocess.Popen:
        return next(p for n, p in self.processes if n == name)

    def stop_apiserver(self) -> None:
        """SIGTERM the API server and wait for it to exit: clients get refused connections until it is back."""
        _terminate(self.process("kube-apiserver"))

    def start_apiserver(self) -> None:
        """Start it again with the same flags (etcd kept everything) and wait until it is ready."""
        self._launch("kube-apiserver", self.arguments["kube-apiserver"])
        self._wait(f"{self.server}/readyz", "kube-apiserver", tls=True)

    def freeze_apiserver(self, frozen: bool) -> None:
        """SIGSTOP/SIGCONT: while frozen the kernel still accepts connections, but nothing answers (unreachable)."""
        os.killpg(self.process("kube-apiserver").pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._launch("etcd", ["--name=default", f"--data-dir={self.directory / 'etcd'}",
                              f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                              f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                              f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync", "--log-level=warn"])
        self._wait(f"{url}/health", "etcd", tls=False)
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        pki = self.pki
        assert pki
        self._launch("kube-apiserver", [
            f"--etcd-servers={etcd_url}", f"--bind-address={podnet.GATEWAY}", f"--advertise-address={podnet.GATEWAY}",
            f"--secure-port={self.api_port}", f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}", f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}", f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true", "--v=1"])
        self._wait(f"{self.server}/readyz", "kube-apiserver", tls=True)

    def _start_controller_manager(self) -> None:
        pki, config = self.pki, str(self.kubeconfig)
        assert pki
        # No node lifecycle controller: the node agent reports Ready but keeps no Lease.
        self._launch("kube-controller-manager", [
            f"--kubeconfig={config}", f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle", "--concurrent-gc-syncs=5", "--v=1"])

    def _start_scheduler(self) -> None:
        config = str(self.kubeconfig)
        self._launch("kube-scheduler", [
            f"--kubeconfig={config}", f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false", "--v=1"])

    def _wait(self, url: str, name: str, tls: bool, timeout: float = 90.0) -> None:
        """Poll a health URL (admin client certificate for the API server) until it answers 200."""
        context = None
        if tls:
            assert self.pki
            context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
            context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
            except OSError as error:
                last = repr(error)
            time.sleep(0.3)
        raise TimeoutError(f"{name} not healthy at {url} after {timeout} s ({last}); log: {self.directory}/{name}.log")

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                tail = (self.directory / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self) -> None:
        for _, process in reversed(self.processes):
            _terminate(process)
        self.processes.clear()


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM (SIGCONT too, in case it is frozen), SIGKILL after 15 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        os.killpg(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
