"""A container's environment and command line as the kubelet computes them.

Env: the image's environment, the ``KUBERNETES_SERVICE_*`` variables (pointing at the API server's
own address: no kube-proxy runs), then the container's ``env`` in order, with ``fieldRef``
(metadata.name, metadata.namespace, metadata.uid, status.podIP, spec.nodeName,
spec.serviceAccountName, metadata.labels['x']), ``configMapKeyRef`` and ``secretKeyRef``, and
``$(VAR)`` references to earlier variables expanded as Kubernetes does (``$$`` escapes).
"""
from __future__ import annotations

import base64
import re
from typing import Any

from kubernetes import client

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def field_value(pod: dict, path: str) -> str:
    """The value of a downward-API ``fieldPath`` for ``pod``."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": status.get("podIP"),
              "status.hostIP": status.get("hostIP")}
    if path in simple:
        return simple[path] or ""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise ValueError(f"fieldRef {path!r} is not supported by the node agent")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names are replaced, unknown ones kept, ``$$`` is ``$``."""
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REFERENCE.sub(replace, text)


def _env_value(core: client.CoreV1Api, pod: dict, source: dict[str, Any]) -> str | None:
    namespace = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return (core.read_namespaced_config_map(ref["name"], namespace).data or {}).get(ref["key"])
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        raw = (core.read_namespaced_secret(ref["name"], namespace).data or {}).get(ref["key"])
        return base64.b64decode(raw).decode() if raw is not None else None
    raise ValueError(f"env valueFrom {sorted(source)} is not supported by the node agent")


def container_env(core: client.CoreV1Api, pod: dict, container: dict, base: dict[str, str]) -> dict[str, str]:
    """``base`` (image env, service env, HOSTNAME) overlaid with the container's ``env`` list."""
    env = dict(base)
    for item in container.get("env") or []:
        if "valueFrom" in item:
            value = _env_value(core, pod, item["valueFrom"])
            if value is not None:
                env[item["name"]] = value
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return env


def resolve_port(container: dict, port: int | str) -> int:
    """A probe's or Service's ``port``: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container['name']} has no port named {port!r}")
