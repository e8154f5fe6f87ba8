"""API error handling: what is retried with backoff, what is final."""
from __future__ import annotations

import asyncio

import aiohttp
import kopf
import pytest

from rollout_router.kube.client import ApiError
from rollout_router_operator import handlers, kube
from tests.k8s.cluster import cluster  # noqa: F401  (fixture)


class FailingClient:  # stands in for rollout_router.kube.client.Client
    def __init__(self, error: Exception, failures: int | None = None):
        self.error, self.discovered, self.failures, self.calls = error, {}, failures, 0

    async def request(self, method, path, **kwargs):
        if path in ("/api/v1", "/apis/apps/v1"):  # discovery answers; the call itself fails
            return {"resources": [{"name": "configmaps", "kind": "ConfigMap", "namespaced": True},
                                  {"name": "deployments", "kind": "Deployment", "namespaced": True}]}
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise self.error
        return {}


@pytest.fixture
def failing(monkeypatch):
    monkeypatch.setattr(kube, "ATTEMPT_DELAYS", (0.0,) * len(kube.ATTEMPT_DELAYS))

    def install(error: Exception, failures: int | None = None) -> FailingClient:
        client = FailingClient(error, failures)

        async def api_client():
            return client
        monkeypatch.setattr(kube, "api_client", api_client)
        return client
    return install


@pytest.mark.parametrize("error", [ApiError(409, "Conflict", ""), ApiError(429, "TooManyRequests", ""),
                                   ApiError(500, "InternalError", ""), ApiError(503, "ServiceUnavailable", ""),
                                   aiohttp.ServerDisconnectedError("connection dropped")])
async def test_conflicts_throttles_5xx_and_drops_are_retryable(failing, error):
    client = failing(error)
    with pytest.raises(kube.RetryableError):
        await kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}})
    assert client.calls == len(kube.ATTEMPT_DELAYS) + 1  # retried at once before giving up to kopf's backoff


async def test_a_few_failures_in_a_row_cost_no_handler_retry(failing):
    """One write in five failing (or a short throttle) is absorbed by the call itself."""
    client = failing(ApiError(503, "ServiceUnavailable", ""), failures=len(kube.ATTEMPT_DELAYS))
    await kube.patch_status("n", "rr", {"observedGeneration": 1})
    await kube.delete("apps/v1", "Deployment", "n", "a")
    assert client.calls == len(kube.ATTEMPT_DELAYS) + 2


async def test_other_client_errors_are_final_and_404_on_delete_is_done(failing):
    client = failing(ApiError(422, "Invalid", ""))
    with pytest.raises(ApiError):
        await kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}})
    assert client.calls == 1  # never retried: the same request cannot succeed
    failing(ApiError(404, "NotFound", ""))
    assert await kube.delete("apps/v1", "Deployment", "n", "a") is False


async def test_a_refused_deletion_leaves_the_object_alone_and_the_reconcile_goes_on(failing, caplog):
    """403: not the operator's object (the admission policy's refusal, e.g. a user's own ServiceMonitor of the
    child's name) or a kind its RBAC lacks; every optional child refused, the apply still completes."""
    failing(ApiError(403, "Forbidden", "may only change or delete objects it manages"))
    await handlers._apply_all(kopf.Body({"metadata": {"name": "rr", "namespace": "n"}}), [])
    for kind in ("ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget", "Deployment"):  # kinds the stand-in serves
        assert f"left {kind} n/rr-router alone: may only change or delete objects it manages" in caplog.text
    failing(ApiError(422, "Invalid", ""))
    with pytest.raises(ApiError):  # anything else still reaches the handler
        await handlers._delete_child("n", ("apps/v1", "Deployment", "rr-router"))


def test_backoff_grows_and_is_capped():
    delays = [handlers._retry(RuntimeError("x"), retry).delay for retry in range(10)]
    assert delays[:4] == [1, 2, 4, 8] and max(delays) == 60
    assert isinstance(handlers._retry(RuntimeError("x"), 0), kopf.TemporaryError)


async def test_paths_for_every_child_kind(cluster, monkeypatch):
    """Plurals come from the API's discovery documents, not from a table."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    from rollout_router.kube.resources import find
    client = await kube.api_client()

    async def _path(api_version, kind, namespace, name=None):
        return (await find(client, api_version, kind)).path(namespace, name)
    try:
        assert await _path("v1", "ConfigMap", "ns", "c") == "/api/v1/namespaces/ns/configmaps/c"
        assert await _path("apps/v1", "Deployment", "ns") == "/apis/apps/v1/namespaces/ns/deployments"
        assert await _path("policy/v1", "PodDisruptionBudget", "ns", "p") == \
            "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/p"
    finally:
        await kube.close()


async def test_concurrent_first_calls_share_one_client(cluster, monkeypatch):
    """The reconcile handler and the status timer start together: one client (one session) for both,
    the other closed, never a session left open behind the one kept."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    made: list = []
    connect = kube.Client.connect

    async def counted() -> kube.Client:
        made.append(await connect())
        return made[-1]
    monkeypatch.setattr(kube.Client, "connect", counted)
    try:
        clients = await asyncio.gather(*(kube.api_client() for _ in range(3)))
        assert len({id(client) for client in clients}) == 1 and len(made) == 3
        assert [client._session.closed for client in made if client is not clients[0]] == [True, True]
    finally:
        await kube.close()
    assert all(client._session.closed for client in made)


def test_kopf_retries_its_own_api_calls_for_ever():
    """kopf gives up after len(error_backoffs) retries and the operator stops; ours has no length, so an
    outage of any length is waited out (30 s apart), and each call starts again from the short delays."""
    import collections.abc
    import itertools

    from rollout_router_operator.cli import ApiBackoffs
    backoffs = ApiBackoffs()
    assert not isinstance(backoffs, collections.abc.Sized)
    first = list(itertools.islice(backoffs, 1000))
    assert first[:5] == [1, 2, 5, 10, 20] and set(first[5:]) == {30}
    assert list(itertools.islice(backoffs, 3)) == [1, 2, 5]  # a fresh schedule for the next call
