"""The few Kubernetes API calls the operator makes, on the ``kubernetes`` client.

Children are written with server-side apply (one PATCH creates or updates,
and fields we stop rendering are removed), so there is no read-modify-write
and no 409 to resolve. Errors are sorted into retryable (kopf backs off and
retries) and permanent ones.
"""
from __future__ import annotations

import functools
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rollout_router.discovery.kubernetes import load_configuration

FIELD_MANAGER = "rollout-router-operator"
# apiVersion/kind -> plural, for the kinds render() produces.
PLURALS = {
    "v1/ConfigMap": "configmaps", "v1/Service": "services", "v1/ServiceAccount": "serviceaccounts",
    "apps/v1/Deployment": "deployments", "policy/v1/PodDisruptionBudget": "poddisruptionbudgets",
    "rbac.authorization.k8s.io/v1/Role": "roles", "rbac.authorization.k8s.io/v1/RoleBinding": "rolebindings",
}


class RetryableError(Exception):
    """A conflict, a throttle, a server error or a dropped connection: try again later."""


@functools.cache
def api_client() -> kubernetes.client.ApiClient:
    """In-cluster service account, else KUBECONFIG (or ~/.kube/config)."""
    return kubernetes.client.ApiClient(load_configuration())


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[f'{api_version}/{kind}']}"
    return f"{path}/{name}" if name else path


def _call(method: str, path: str, body: Any = None, query: list | None = None, content_type: str | None = None) -> Any:
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    client = api_client()
    try:
        request = client.param_serialize(method, path, query_params=query or [], header_params=headers, body=body,
                                         auth_settings=["BearerToken"])
        response = client.call_api(*request, _request_timeout=30)
        response.read()
        return client.response_deserialize(response, {"2XX": "object"}).data
    except ApiException as error:
        if error.status in (409, 429) or error.status >= 500:
            raise RetryableError(f"{method} {path}: HTTP {error.status} {error.reason}") from error
        raise
    except HTTPError as error:
        raise RetryableError(f"{method} {path}: {error!r}") from error


def apply(manifest: dict) -> None:
    """Server-side apply, taking ownership of every field we render."""
    meta = manifest["metadata"]
    _call("PATCH", _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]), manifest,
          query=[("fieldManager", FIELD_MANAGER), ("force", "true")], content_type="application/apply-patch+yaml")


def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete one child; False if it was already gone."""
    try:
        _call("DELETE", _path(api_version, kind, namespace, name), {"propagationPolicy": "Background"})
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def list_pods(namespace: str, label_selector: str) -> list[dict]:
    body = _call("GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", label_selector)])
    return body.get("items") or []
