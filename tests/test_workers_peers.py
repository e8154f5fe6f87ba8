"""The worker API beside the real routers: the same calls to SGLang's router, vllm-router and ours, same answers.

sglang-router 0.3.2 and vllm-router 0.1.17 (PyPI, installed by ``make install-test``)
run as processes next to ``rollout-router serve``; every call goes to each, and
our answer must have their status and at least their JSON keys. A stub worker
answers the health and model-info calls SGLang's router makes before it lists one.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rollout_router.listening import read_port_file
from tests.support import wait_until

BIN = Path(sys.executable).parent


class _Stub(BaseHTTPRequestHandler):
    """A worker as far as a router's registration goes: 200 JSON on every path."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"model_path": "stub", "data": [{"id": "stub", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    """For the peers, which cannot report a port they bound themselves."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, document: object = None) -> tuple[int, object]:
    data = json.dumps(document).encode() if document is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, content_type, body = response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as error:
        status, content_type, body = error.code, error.headers.get_content_type(), error.read()
    return status, json.loads(body) if content_type == "application/json" else ("text", content_type)


def _up(base: str) -> bool:
    return call(base, "GET", "/workers")[0] == 200


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _process(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def routers(tmp_path_factory) -> Iterator[dict[str, str]]:
    """Base URLs of ours, SGLang's router and vllm-router, each started without workers."""
    work = tmp_path_factory.mktemp("peers")
    ports = {name: (_free_port(), _free_port()) for name in ("sglang", "vllm")}
    processes = {
        "ours": _process([str(BIN / "rollout-router"), "serve", "--host", "127.0.0.1", "--port", "0",
                          "--admin-port", "0", "--port-file", str(work / "ports.json")], work / "ours.log"),
        "sglang": _process([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                            "--port", str(ports["sglang"][0]), "--prometheus-port", str(ports["sglang"][1])],
                           work / "sglang.log"),
        "vllm": _process([str(BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(ports["vllm"][0]),
                          "--prometheus-port", str(ports["vllm"][1])], work / "vllm.log"),
    }
    try:
        bound = wait_until(lambda: read_port_file(work / "ports.json"), "rollout-router's port file")
        bases = {"ours": f"http://127.0.0.1:{bound['admin']}",  # type: ignore[index]  # the worker API is admin
                 **{name: f"http://127.0.0.1:{ports[name][0]}" for name in ("sglang", "vllm")}}
        for name, base in bases.items():
            wait_until(lambda: _up(base), f"{name} router to answer GET /workers")
        yield bases
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(timeout=10)


def assert_same_shape(ours: tuple[int, object], theirs: tuple[int, object]) -> None:
    """Same status; a JSON answer has at least their keys, a text answer has their content type.

    Errors are compared by status only: ours carry this router's JSON error body
    (``{"error": {"message", "type", "param", "code"}}``), theirs differ between them.
    """
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] >= 400:
        assert isinstance(ours[1], dict) and ours[1]["error"]["code"] == ours[0]
    elif isinstance(theirs[1], dict):
        assert isinstance(ours[1], dict) and set(theirs[1]) <= set(ours[1]), (ours, theirs)
    else:
        assert ours[1] == theirs[1], (ours, theirs)


def _listed(base: str) -> list[dict]:
    return call(base, "GET", "/workers")[1]["workers"]  # type: ignore[index]


def test_rest_api_matches_sglang_router(routers, stub):
    """SGLang's router 0.3.x: the calls slime makes with sglang-router >= 0.3 (POST, GET, DELETE /workers/{id})."""
    ours, sglang = routers["ours"], routers["sglang"]
    assert_same_shape(call(ours, "GET", "/workers"), call(sglang, "GET", "/workers"))
    assert call(ours, "GET", "/workers")[1]["stats"].keys() == call(sglang, "GET", "/workers")[1]["stats"].keys()
    register = {"url": stub, "worker_type": "regular"}
    assert_same_shape(call(ours, "POST", "/workers", register), call(sglang, "POST", "/workers", register))
    wait_until(lambda: _listed(sglang), "SGLang's router to list the stub worker")
    [mine], [theirs] = _listed(ours), _listed(sglang)
    assert set(theirs) <= set(mine) and mine["url"] == theirs["url"] == stub
    assert_same_shape(call(ours, "GET", f"/workers/{mine['id']}"), call(sglang, "GET", f"/workers/{theirs['id']}"))
    unknown = "/workers/00000000-0000-0000-0000-000000000000"
    assert_same_shape(call(ours, "DELETE", unknown), call(sglang, "DELETE", unknown))
    assert_same_shape(call(ours, "DELETE", f"/workers/{mine['id']}"),
                      call(sglang, "DELETE", f"/workers/{theirs['id']}"))
    wait_until(lambda: not _listed(sglang), "SGLang's router to drop the worker")
    assert _listed(ours) == []


def test_legacy_api_matches_vllm_router(routers, stub):
    """vllm-router (and SGLang's router up to 0.2.1): /add_worker, /list_workers, /remove_worker by ?url=."""
    ours, vllm = routers["ours"], routers["vllm"]
    for method, path in [("GET", "/list_workers"), ("POST", f"/add_worker?url={stub}"), ("GET", "/list_workers"),
                         ("POST", f"/add_worker?url={stub}"), ("POST", f"/remove_worker?url={stub}"),
                         ("GET", "/list_workers")]:
        mine, theirs = call(ours, method, path), call(vllm, method, path)
        assert_same_shape(mine, theirs)
        if path == "/list_workers":
            assert mine == theirs
    mine, theirs = call(ours, "POST", "/workers", {"url": stub}), call(vllm, "POST", "/workers", {"url": stub})
    assert mine[0] // 100 == theirs[0] // 100 == 2 and set(theirs[1]) <= set(mine[1])  # type: ignore[arg-type]
    assert [w["url"] for w in _listed(ours)] == [w["url"] for w in _listed(vllm)] == [stub]
    gone = f"/workers/{urllib.request.quote(stub, safe='')}"
    mine, theirs = call(ours, "DELETE", gone), call(vllm, "DELETE", gone)
    assert mine[0] // 100 == theirs[0] // 100 == 2 and set(theirs[1]) <= set(mine[1])  # type: ignore[arg-type]
    assert _listed(ours) == _listed(vllm) == []
