"""Replica URLs, static or registered over the worker API, are parsed strictly: a CR/LF, a space, a port outside
1-65535, an empty host, user:password@, a query or fragment is refused naming the problem (a worker URL with CR/LF
used to inject a Set-Cookie into client responses; port 99999 was accepted)."""
from __future__ import annotations

import pytest

from rollout_router.settings import Backend, RouterSettings, SettingsError, parse_settings
from tests.support import running_router


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:8000\r\nSet-Cookie: a=b", "control characters"),
    ("http://vllm 0:8000", "spaces"),
    ("http://vllm-0:99999", "1-65535"),
    ("http://vllm-0:0", "1-65535"),
    ("http://vllm-0:", "1-65535"),
    ("http://:8000", "no host"),
    ("http://user:secret@vllm-0:8000", "user:password@"),
    ("http://vllm-0:8000/?a=b", "query"),
    ("http://vllm-0:8000/#x", "fragment"),
    ("grpc://vllm-0:99999", "1-65535"),
])
def test_bad_replica_urls_are_refused_naming_the_problem(url, says):
    with pytest.raises(SettingsError, match=says):
        parse_settings({"url": url}, Backend)


@pytest.mark.parametrize("url", ["http://vllm-0:8000", "https://vllm-0", "http://[fd00::1]:8000/prefix/",
                                 "http://10.0.0.7:8000", "grpc://vllm-0:50051"])
def test_good_replica_urls_still_parse(url):
    assert parse_settings({"url": url}, Backend).url == url.rstrip("/")


async def test_the_worker_api_refuses_an_injected_header(http):
    async with running_router(RouterSettings()) as (_, runtime):
        for url in ("http://127.0.0.1:1%0d%0aSet-Cookie:%20a=b", "http://127.0.0.1:99999"):
            answer = await http.post(f"{runtime.admin_url}/add_worker?url={url}")
            body = await answer.json()
            assert answer.status == 400 and body["error"]["param"] == "url", body
        assert runtime.replicas.replicas() == []


def test_a_bad_worker_network_names_the_key_as_written():
    from rollout_router.settings import RouterSettings, SettingsError, parse_settings
    with pytest.raises(SettingsError) as caught:
        parse_settings({"workerApi": {"allowedNetworks": ["10.0.0.0/8", "10.0.0.0/33"]}}, RouterSettings)
    assert "workerApi.allowedNetworks" in str(caught.value) and "'10.0.0.0/33' is not a network" in str(caught.value)
    assert parse_settings({"workerApi": {"allowedNetworks": ["10.1.2.3/8"]}},
                          RouterSettings).worker_api.allowed_networks == ["10.0.0.0/8"]
