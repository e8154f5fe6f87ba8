"""Which container runtime the tier's node agent uses, decided once per run and reported.

``podman``: the pods of the project's two images (the router and the operator, built by ``make image``
with podman + runc) run from those images, in their pods' network namespaces, with the pod's
securityContext. ``processes``: podman or an image is missing, so those pods run as processes of the
installed package instead (nodeagent/container.py); the run says so in its header and summary and in
each test's ``runtime`` property, never silently.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROUTER_IMAGE = "ghcr.io/rolloutrouter/rollout-router:0.1.0"
OPERATOR_IMAGE = "ghcr.io/rolloutrouter/rollout-router-operator:0.1.0"
PROJECT_IMAGES = (ROUTER_IMAGE, OPERATOR_IMAGE)
# crun (podman's default) fails on these machines (cgroups in hybrid mode, setrlimit not permitted): runc,
# cgroupfs and a containers.conf without default ulimits, as tests/realk8s/podman-image.sh builds with.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
AGENT_LABEL = "io.rolloutrouter.nodeagent"  # on every container the node agent runs, to remove leftovers


@dataclass(frozen=True)
class Runtime:
    name: str  # "podman" or "processes"
    reason: str  # why processes (empty for podman)

    def describe(self) -> str:
        if self.name == "podman":
            return (f"realk8s runtime: podman + runc; the router and operator pods run from the project's images "
                    f"({', '.join(PROJECT_IMAGES)})")
        return (f"realk8s runtime: FALLBACK to processes ({self.reason}); the router and operator pods run as "
                "processes of the installed package, not from the project's images")


def podman_env() -> dict[str, str]:
    """The environment podman itself runs with."""
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def detect() -> Runtime:
    """podman when it is installed and both project images are in its local storage; else processes, and why.

    ``REALK8S_RUNTIME=processes`` forces the fallback (the reason given is that setting).
    """
    if os.environ.get("REALK8S_RUNTIME", "").strip() == "processes":
        return Runtime("processes", "REALK8S_RUNTIME=processes")
    if not shutil.which("podman") or not shutil.which("runc"):
        return Runtime("processes", "podman or runc is not installed; `make image` installs them")
    env = podman_env()
    missing = [image for image in PROJECT_IMAGES
               if subprocess.run([*PODMAN, "image", "exists", image], env=env, capture_output=True).returncode != 0]
    if missing:
        return Runtime("processes", f"image {', '.join(missing)} not built; `make image` builds it")
    return Runtime("podman", "")


def remove_leftover_containers() -> None:
    """Containers of an earlier node agent that did not get to stop them (killed, crashed)."""
    if not shutil.which("podman"):
        return
    env = podman_env()
    listed = subprocess.run([*PODMAN, "ps", "-aq", "--filter", f"label={AGENT_LABEL}"], env=env,
                            capture_output=True, text=True)
    names = listed.stdout.split()
    if names:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", *names], env=env, capture_output=True)
