"""The session-key conventions of other routers, by configuration: one test per row of docs/integrations.md.

Each row sends the key the way that router's clients do and checks that the
session is pinned under exactly that key (``DELETE /v1/sessions/{key}``
finds it) and that its turns stay on one replica.
"""
from __future__ import annotations

import aiohttp
import pytest

from rollout_router.proxy.session_key import body_key
from rollout_router.settings import RouterSettings, SessionSettings
from tests.support import running_router, scripted_replicas

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
VLLM_ROUTER_HEADERS = ["X-Session-Id", "X-User-Id", "X-Tenant-Id", "X-Correlation-Id", "X-Request-Id", "X-Trace-Id"]
VLLM_ROUTER_FIELDS = ["session_params.session_id", "user", "session_id", "user_id"]

# (row, session settings, headers sent, body fields sent, the key expected)
ROWS = [
    ("vllm-router header", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {"X-Session-Id": "traj-1", "X-Request-Id": "per-request"}, {}, "traj-1"),
    ("vllm-router x-user-id", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {"x-user-id": "user-7"}, {"user": "ignored: headers first"}, "user-7"),
    ("vllm-router session_params.session_id", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {}, {"session_params": {"session_id": "nested-1"}, "user": "u", "session_id": "legacy"}, "nested-1"),
    ("vllm-router user", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {}, {"user": "alice", "session_id": "legacy"}, "alice"),
    ("vllm-router session_id", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {}, {"session_id": "legacy-2", "user_id": "u"}, "legacy-2"),
    ("vllm-router user_id", {"headers": VLLM_ROUTER_HEADERS, "body_fields": VLLM_ROUTER_FIELDS},
     {}, {"user_id": "uid-3"}, "uid-3"),
    ("SGLang router X-SMG-Routing-Key", {"headers": ["X-SMG-Routing-Key"]},
     {"x-smg-routing-key": "rk-1"}, {}, "rk-1"),
    ("SGLang session_params.id", {"headers": [], "body_fields": ["session_params.id"]},
     {}, {"session_params": {"id": "sgl-session", "rid": "r1"}}, "sgl-session"),
    ("production-stack --session-key", {"headers": ["x-user-id"], "body_fields": ["x-user-id"]},
     {}, {"x-user-id": "from-body"}, "from-body"),
]


@pytest.mark.parametrize(("session", "headers", "fields", "key"), [row[1:] for row in ROWS],
                         ids=[row[0] for row in ROWS])
async def test_convention_pins_the_session_under_its_key(session, headers, fields, key):
    async with scripted_replicas(30, 3) as replicas:
        settings = RouterSettings(backends=[r.url for r in replicas], session=SessionSettings(**session))
        async with running_router(settings) as (base, runtime), aiohttp.ClientSession() as http:
            served = set()
            for _ in range(3):
                async with http.post(f"{base}/v1/chat/completions", json={**CHAT, **fields}, headers=headers) as r:
                    assert r.status == 200
                    served.add(r.headers["X-RolloutRouter-Replica"])
            assert len(served) == 1
            async with http.delete(f"{runtime.admin_url}/v1/sessions/{key}") as released:
                assert released.status == 200, await released.text()


@pytest.mark.parametrize(("document", "expected"), [
    (b'{"session_params": {"id": "a"}}', "a"),
    (b'{"session_params": {"id": 7}}', "7"),
    (b'{"session_params": "not an object", "user": "u"}', "u"),
    (b'{"session_params": {"other": 1}, "user": "u"}', "u"),
    (b'{"session_params": null}', None),
    (b'{"session_params.id": "a flat key with a dot is not read"}', None),
])
def test_dotted_body_fields_step_into_nested_objects(document, expected):
    settings = SessionSettings(body_fields=["session_params.id", "user"])
    assert body_key(document, "application/json", settings) == expected
