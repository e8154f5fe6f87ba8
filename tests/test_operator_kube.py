"""API error handling: what is retried with backoff, what is final."""
from __future__ import annotations

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from rollout_router_operator import handlers, kube


class FailingClient:
    def __init__(self, error: Exception):
        self.error = error

    def param_serialize(self, *args, **kwargs):
        return ("PATCH", "http://api/x", {}, None, None)

    def call_api(self, *args, **kwargs):
        raise self.error


@pytest.fixture
def failing(monkeypatch):
    def install(error: Exception) -> None:
        monkeypatch.setattr(kube, "api_client", lambda: FailingClient(error))
    return install


@pytest.mark.parametrize("error", [ApiException(status=409, reason="Conflict"), ApiException(status=429),
                                   ApiException(status=500), ApiException(status=503),
                                   ProtocolError("connection dropped")])
def test_conflicts_throttles_5xx_and_drops_are_retryable(failing, error):
    failing(error)
    with pytest.raises(kube.RetryableError):
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}})


def test_other_client_errors_are_final_and_404_on_delete_is_done(failing):
    failing(ApiException(status=422, reason="Invalid"))
    with pytest.raises(ApiException):
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}})
    failing(ApiException(status=404))
    assert kube.delete("apps/v1", "Deployment", "n", "a") is False


def test_backoff_grows_and_is_capped():
    delays = [handlers._retry(RuntimeError("x"), retry).delay for retry in range(10)]
    assert delays[:4] == [1, 2, 4, 8] and max(delays) == 60
    assert isinstance(handlers._retry(RuntimeError("x"), 0), kopf.TemporaryError)


def test_paths_for_every_child_kind():
    assert kube._path("v1", "ConfigMap", "ns", "c") == "/api/v1/namespaces/ns/configmaps/c"
    assert kube._path("apps/v1", "Deployment", "ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert kube._path("policy/v1", "PodDisruptionBudget", "ns", "p") == \
        "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/p"
