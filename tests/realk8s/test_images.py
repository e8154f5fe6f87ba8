"""The router and operator pods as the node agent runs them: from the project's images (podman + runc),
in their pods' network namespaces, with their pods' securityContext.

Read from the kernel's view of each container's first process (/proc): its user, its root mount, its
capabilities, its network namespace, and what its root filesystem holds. Under the processes fallback
(runtime.py says when and why) the same securityContext checks run on the processes, and the image checks
are replaced by the fallback's own: the run reports the runtime in its header, summary and properties.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from . import podnet
from .nodeagent import podman
from .runtime import OPERATOR_IMAGE, PODMAN, ROUTER_IMAGE, podman_env
from .workloads import deploy_rollouts

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(600)]
NONROOT = "65532"


def first_process(pod: dict) -> int:
    """The host pid of the pod's (only) container's first process."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    kind, _, ref = container_id.partition("://")
    return podman.main_pid(ref) if kind == "podman" else int(ref)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def root_mount_options(pid: int) -> set[str]:
    """The mount options of the process's ``/`` (mountinfo field 6)."""
    options: set[str] = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            options = set(fields[5].split(","))
    return options


def image_id(image: str) -> str:
    answer = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", image], env=podman_env(),
                            capture_output=True, text=True, check=True)
    return answer.stdout.strip()


def check_security_context(pod: dict) -> int:
    """uid/gid 65532, read-only root, no new privileges, no capabilities, in the pod's own network namespace."""
    pid = first_process(pod)
    status = proc_status(pid)
    assert status["Uid"].split() == [NONROOT] * 4 and status["Gid"].split() == [NONROOT] * 4, status
    assert status["NoNewPrivs"] == "1" and int(status["CapEff"], 16) == 0
    assert "ro" in root_mount_options(pid)
    netns = Path("/run/netns") / podnet.netns_name(pod["metadata"]["uid"])
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns).st_ino
    return pid


def test_router_and_operator_pods_run_from_the_projects_images_as_their_security_context_says(
        cluster, operator_release, namespace, runtime, record_property):
    router = deploy_rollouts(cluster, namespace, vllm_replicas=1)
    operator = cluster.wait_ready_pods(operator_release, "app.kubernetes.io/component=operator", 1)[0]
    print(f"\n{runtime.describe()}")
    for pod, image in ((router, ROUTER_IMAGE), (operator, OPERATOR_IMAGE)):
        assert pod["spec"]["containers"][0]["image"] == image
        pid = check_security_context(pod)
        container = pod["status"]["containerStatuses"][0]
        in_image = Path(f"/proc/{pid}/root/opt/rollout-router/bin/rollout-router")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if runtime.name == "podman":
            assert container["containerID"].startswith("podman://") and container["imageID"] == image_id(image)
            assert in_image.is_file() and b"/opt/rollout-router/bin/rollout-router" in cmdline  # the image's venv
            capabilities = proc_status(pid)["CapBnd"]
            assert int(capabilities, 16) == 0, capabilities  # capabilities: drop: [ALL]
        else:
            assert container["containerID"].startswith("process://") and not in_image.exists()
        record_property(f"{pod['metadata']['name']}-runs", container["containerID"].split("://")[0])
