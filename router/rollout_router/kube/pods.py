"""Pure pod helpers: readiness and named ports, as the kubelet and Services read them."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not terminating: the only pods that may take requests."""
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def container_port(pod: Mapping[str, Any], port: int | str | None) -> int | None:
    """A number as is; a name looked up among the pod's container ports (None if no container has it)."""
    if port is None or isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for container in pod.get("spec", {}).get("containers", []):
        for candidate in container.get("ports") or []:
            if candidate.get("name") == port:
                return candidate.get("containerPort")
    return None
