"""The router in front of REAL vLLM servers (CPU build, a tiny random model built locally).

Opt-in (``ROLLOUT_ROUTER_REAL_VLLM=1``, ``make test-vllm``): see conftest.py and docs/real-vllm.md.
Two vLLM OpenAI servers and one vLLM gRPC server start at once on 127.0.0.21-23; the router is
``rollout-router serve`` from the project's own virtualenv, as in production. The official
``openai`` client and vLLM's own gRPC stubs talk to the router. The tests run in file order and
share the servers; the crash test, which kills a replica, comes last.
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import grpc
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.localfleet import Service, free_port, spawn

from .conftest import ENV, LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .vllm_process import SERVED_MODEL, VllmServer

if not enabled():  # only reached when this file is named on the command line without the variable
    pytest.skip(f"the real-vLLM tier is opt-in: set {ENV}=1 (make test-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(420)]

HOSTS = ("127.0.0.21", "127.0.0.22")
GRPC_HOST = "127.0.0.23"
STARTUP_TIMEOUT = 300.0  # three servers starting at once on 2 cores: each ready after 31-74 s here
NO_EOS = {"ignore_eos": True}  # vLLM sampling extension: random weights must not stop early
TIMINGS: dict[str, object] = {}  # measurements, written to LOG_DIR/timings.json
STREAMS = 60  # streams read to the end by test_streams_read_to_the_end_are_counted_as_200


# --- helpers -----------------------------------------------------------------------------------

def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus endpoint, keyed by (sample name, sorted labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))


def client_for(router: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=120)


def wait_until(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def prompt_words(tag: str, count: int) -> str:
    """Text unlike the tokenizer's training corpus, so it spends many tokens (full KV blocks)."""
    return " ".join(f"{tag}{i * 37 % 101}q" for i in range(count))


def start_router(name: str, backends: list[str], args: list[str], grpc: bool = False) -> Service:
    """``rollout-router serve`` from this (the project's) virtualenv, logging to LOG_DIR/NAME.log."""
    flags = [arg for backend in backends for arg in ("--backend", backend)]
    extra = ["--grpc-port", "0"] if grpc else []
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / f"{name}.log", "w") as log:
        starting = spawn(["serve", "--log-level", "warning", *flags, *extra, *args], "127.0.0.1", log)
    router = starting.bound()

    def ready() -> bool:
        if router.process.poll() is not None:
            raise RuntimeError(f"router {name} exited: {(LOG_DIR / f'{name}.log').read_text()[-2000:]}")
        try:
            return get_json(f"{router.url}/readyz").get("status") == "ready"
        except OSError:
            return False
    try:
        wait_until(ready, 30, f"router {name} to become ready")
    except BaseException:
        router.stop()
        raise
    return router


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, VllmServer]]:
    """Start the two HTTP servers and the gRPC server together; each fixture waits for its own."""
    started = {}
    try:
        for name, host, is_grpc, cpu in (("a", HOSTS[0], False, "0"), ("b", HOSTS[1], False, "1"),
                                        ("grpc", GRPC_HOST, True, "1")):
            started[name] = VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, free_port(host),
                                       LOG_DIR / f"vllm-{name}.log", grpc=is_grpc, cpu=cpu).start()
        yield started
    finally:
        for server in started.values():
            server.stop()
        for name, server in started.items():
            if server.ready_after is not None:
                TIMINGS[f"vllm {name} ready after (s)"] = round(server.ready_after, 1)
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        (LOG_DIR / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


@pytest.fixture(scope="module")
def fleet(servers) -> Iterator[tuple[Service, list[VllmServer]]]:
    """The router (margin 0) in front of the two HTTP servers."""
    replicas = [servers["a"], servers["b"]]
    for replica in replicas:
        replica.wait_ready(STARTUP_TIMEOUT)
    router = start_router("router-http", [r.url for r in replicas], ["--affinity-break-margin", "0"])
    try:
        yield router, replicas
    finally:
        router.stop()


@pytest.fixture(scope="module")
def grpc_fleet(servers) -> Iterator[tuple[Service, VllmServer]]:
    """A router serving gRPC in front of vLLM's gRPC frontend, a server of its own with no OpenAI HTTP port:
    the replica is given by its gRPC address alone and probed over gRPC with the default health settings."""
    server = servers["grpc"]
    server.wait_ready(STARTUP_TIMEOUT)
    router = start_router("router-grpc", [f"grpc://{server.target}"], ["--affinity-break-margin", "0"], grpc=True)
    try:
        yield router, server
    finally:
        router.stop()


# --- HTTP ---------------------------------------------------------------------------------------

def test_models_are_answered_by_a_replica(fleet):
    router, replicas = fleet
    raw = client_for(router).models.with_raw_response.list()
    assert [m.id for m in raw.parse().data] == [SERVED_MODEL]
    assert raw.headers["x-rolloutrouter-replica"] in {r.url for r in replicas}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_chat_and_completions_pass_through(fleet, kind, stream):
    router, replicas = fleet
    client = client_for(router)
    started = time.monotonic()
    common = dict(model=SERVED_MODEL, max_tokens=16, extra_body=NO_EOS, stream=stream,
                  extra_headers={"X-Session-ID": f"pass-{kind}-{stream}"})
    if stream:
        common["stream_options"] = {"include_usage": True}
    create = client.chat.completions if kind == "chat" else client.completions
    payload = ({"messages": [{"role": "user", "content": "solve x + 1 = 2"}]} if kind == "chat"
               else {"prompt": "once upon a time"})
    raw = create.with_raw_response.create(**common, **payload)
    assert raw.headers["x-rolloutrouter-replica"] in {r.url for r in replicas}
    if not stream:
        answer = raw.parse()
        assert answer.model == SERVED_MODEL and answer.usage.completion_tokens == 16
        assert answer.choices[0].finish_reason == "length"
        text = answer.choices[0].message.content if kind == "chat" else answer.choices[0].text
        assert text
    else:
        assert raw.headers["content-type"].startswith("text/event-stream")
        chunks = list(raw.parse())
        pieces = [c for c in chunks if c.choices and (c.choices[0].delta.content if kind == "chat"
                                                        else c.choices[0].text)]
        assert len(pieces) > 1  # arrived in pieces, not as one buffered body
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    TIMINGS[f"{kind} {'streamed' if stream else 'whole'} 16 tokens (s)"] = round(time.monotonic() - started, 3)
    assert get_json(f"{router.admin_url}/status")["total_inflight"] == 0


def test_session_sticks_and_only_its_replica_reuses_the_prefix(fleet):
    router, replicas = fleet
    client = client_for(router)
    by_url = {r.url: r for r in replicas}
    before = {r.url: total(scrape(r.url), "vllm:prefix_cache_hits_total") for r in replicas}
    messages = [{"role": "system", "content": prompt_words("sys", 120)},
                {"role": "user", "content": "solve the equation"}]
    served, cached = [], []
    for turn in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=SERVED_MODEL, messages=messages, max_tokens=8, extra_body=NO_EOS,
            extra_headers={"X-Session-ID": "sticky-trajectory"})
        answer = raw.parse()
        served.append(raw.headers["x-rolloutrouter-replica"])
        details = answer.usage.prompt_tokens_details
        cached.append(details.cached_tokens if details else None)
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": f"tool said ok {turn}"}]
    assert len(set(served)) == 1, served
    home = served[0]
    other = next(url for url in by_url if url != home)

    def hits_grew():
        now = {url: total(scrape(url), "vllm:prefix_cache_hits_total") for url in by_url}
        return now if now[home] > before[home] else None

    after = wait_until(hits_grew, what=f"{home}'s vllm:prefix_cache_hits_total to grow")
    assert after[other] == before[other], "the other replica saw prefix hits for this session"
    assert cached[0] == 0 and all(c and c >= 128 for c in cached[1:]), cached  # whole 128-token blocks
    TIMINGS["sticky session: prefix-cache hit tokens on its replica"] = after[home] - before[home]
    TIMINGS["sticky session: usage.prompt_tokens_details.cached_tokens per turn"] = cached
    status = get_json(f"{router.admin_url}/status")
    assert status["affinity_kept"] >= 3 and status["total_inflight"] == 0


def test_router_status_and_metrics_agree(fleet):
    router, replicas = fleet
    urls = [r.url for r in replicas]

    def successes() -> dict[str, float]:
        return {url: total(scrape(url), "vllm:request_success_total") for url in urls}

    def routed() -> dict[str, float]:
        return {url: total(scrape(router.admin_url), "rolloutrouter_requests_total", backend=url, code="200")
                for url in urls}

    # The router's per-replica request counts move exactly as the replicas' own counters do.
    vllm_before, router_before = successes(), routed()
    client = client_for(router)
    for i in range(6):  # unkeyed: least-loaded, spread over both replicas by the tie-break
        client.completions.create(model=SERVED_MODEL, prompt=f"unkeyed {i}", max_tokens=2, extra_body=NO_EOS)

    def six_more() -> dict[str, float] | None:  # vLLM updates its counters just after answering
        now = successes()
        return now if sum(now.values()) - sum(vllm_before.values()) >= 6 else None

    vllm_after = wait_until(six_more, what="the replicas to count 6 more successes")
    router_after = routed()
    assert {u: router_after[u] - router_before[u] for u in urls} == {u: vllm_after[u] - vllm_before[u] for u in urls}

    status = get_json(f"{router.admin_url}/status")
    metrics = scrape(router.admin_url)
    for field in ("affinity_kept", "affinity_broken", "new_sessions", "unkeyed", "released"):
        assert total(metrics, f"rolloutrouter_{field}_total") == status[field], field
    assert total(metrics, "rolloutrouter_sessions") == status["sessions"]
    assert total(metrics, "rolloutrouter_backends_ready") == status["backends_ready"] == 2
    for backend in status["backends"]:
        assert total(metrics, "rolloutrouter_backend_inflight_requests", backend=backend["url"]) == backend["inflight"]
    # Every request so far was answered 200 by some replica, streams read to [DONE] included.
    assert {dict(ls)["code"] for (n, ls) in metrics if n == "rolloutrouter_requests_total"} == {"200"}
    counted = {url: total(metrics, "rolloutrouter_requests_total", backend=url) for url in urls}
    assert sum(counted.values()) >= 15 and all(counted.values())  # 1 models + 4 pass-through + 4 turns + 6
    assert status["unkeyed"] >= 6 and status["total_inflight"] == 0


def test_streams_read_to_the_end_are_counted_as_200(fleet):
    """Before bb32deb, 4 and 9 of 30 such streams were counted 499 in two runs (0 of 60 against the fake)."""
    router, _ = fleet
    client = client_for(router)

    def codes() -> dict[str, float]:
        metrics = scrape(router.admin_url)
        return {code: total(metrics, "rolloutrouter_requests_total", code=code) for code in ("200", "499")}

    before = codes()
    for i in range(STREAMS):
        chunks = list(client.chat.completions.create(
            model=SERVED_MODEL, messages=[{"role": "user", "content": f"short {i}"}], max_tokens=16,
            extra_body=NO_EOS, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 16  # the client got the whole answer
    wait_until(lambda: get_json(f"{router.admin_url}/status")["total_inflight"] == 0, what="in-flight back to 0")
    after = codes()
    counted = {code: after[code] - before[code] for code in after}
    TIMINGS[f"{STREAMS} streams read to [DONE]: router codes"] = counted
    assert counted == {"200": STREAMS, "499": 0}, counted


def test_errors_from_vllm_reach_the_client_unchanged(fleet):
    router, _ = fleet
    client = client_for(router)
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    body = missing.value.body
    assert isinstance(body, dict) and {"message", "type", "code"} <= set(body), body
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=SERVED_MODEL, prompt="hi", max_tokens=5000)
    body = too_long.value.body
    assert isinstance(body, dict) and body.get("code") == 400 and "max_model_len" in body.get("message", ""), body
    TIMINGS["error bodies"] = {"404": missing.value.body, "400": too_long.value.body}
    assert get_json(f"{router.admin_url}/status")["total_inflight"] == 0


def test_margin_zero_moves_a_session_off_a_replica_held_busy(fleet):
    router, replicas = fleet
    client = client_for(router)

    def turn(session: str) -> str:
        raw = client.completions.with_raw_response.create(
            model=SERVED_MODEL, prompt=f"turn of {session}", max_tokens=2, extra_body=NO_EOS,
            extra_headers={"X-Session-ID": session})
        raw.parse()
        return raw.headers["x-rolloutrouter-replica"]

    def loads() -> dict[str, int]:
        return {b["url"]: b["inflight"] for b in get_json(f"{router.admin_url}/status")["backends"]}

    home = turn("mover")
    other = next(r.url for r in replicas if r.url != home)
    # A key that the router places on the same replica (new sessions go least-loaded; ties by key hash).
    tried = 0
    for hold_key in (f"hold-{i}" for i in range(40)):
        tried += 1
        if turn(hold_key) == home:
            break
    else:
        pytest.fail("no key among 40 was placed on the mover's replica")
    before = get_json(f"{router.admin_url}/status")
    # The hold is a long stream the client stops reading. How long the router holds it depends on how
    # fast vLLM's frontend emits it (measured: 0.4 to 4 s for 1900 tokens), so the check is retried.
    attempts: list[str] = []
    moved = home
    for _ in range(5):
        wait_until(lambda: get_json(f"{router.admin_url}/status")["total_inflight"] == 0, what="in-flight back to 0")
        hold = client.completions.create(model=SERVED_MODEL, prompt="hold the replica", max_tokens=1900,
                                         extra_body=NO_EOS, stream=True, extra_headers={"X-Session-ID": hold_key})
        try:
            assert hold.response.headers["x-rolloutrouter-replica"] == home
            next(iter(hold))  # the replica is generating
            held = loads()
            if held != {home: 1, other: 0}:
                attempts.append(f"hold over before the turn: {held}")
                continue
            moved = turn("mover")  # skew 1 > margin 0: the pin breaks
        finally:
            hold.close()  # the client leaves mid-stream; the router must release the hold's lease
            closed_at = time.monotonic()
        if moved == other:
            break
        attempts.append("hold over during the turn (kept)")
    TIMINGS["margin 0: attempts that raced the hold"] = attempts
    assert moved == other, f"the pin never broke; attempts: {attempts}"
    after = get_json(f"{router.admin_url}/status")
    assert after["affinity_broken"] == before["affinity_broken"] + 1
    wait_until(lambda: get_json(f"{router.admin_url}/status")["total_inflight"] == 0, what="in-flight back to 0")
    TIMINGS["margin 0: keys tried to find a hold key"] = tried
    TIMINGS["margin 0: client closed the hold -> router in-flight 0 (s)"] = round(time.monotonic() - closed_at, 3)
    wait_until(lambda: total(scrape(home), "vllm:num_requests_running") == 0, what=f"{home} to end the hold")
    assert turn("mover") == other  # re-pinned: the next turn, with no skew, stays where it moved


# --- gRPC ---------------------------------------------------------------------------------------

def test_grpc_generate_through_the_router_with_vllm_stubs(grpc_fleet):
    router, server = grpc_fleet
    prompt = [(i * 37) % 500 + 7 for i in range(300)]  # token ids: the gRPC frontend takes them as is
    with grpc.insecure_channel(router.grpc_target) as channel:
        stub = pb_grpc.VllmEngineStub(channel)

        def generate(ids: list[int]) -> tuple[list, str]:
            request = pb.GenerateRequest(request_id=f"rr-{time.monotonic_ns()}",
                                         tokenized=pb.TokenizedInput(input_ids=ids), stream=True,
                                         sampling_params=pb.SamplingParams(max_tokens=6, ignore_eos=True))
            call = stub.Generate(request, metadata=(("x-session-id", "grpc-trajectory"),), timeout=60)
            messages = list(call)
            return messages, dict(call.initial_metadata())["x-rolloutrouter-replica"]

        started = time.monotonic()
        first, replica = generate(prompt)
        TIMINGS["grpc Generate 300+6 tokens (s)"] = round(time.monotonic() - started, 3)
        assert [m.WhichOneof("response") for m in first][-1] == "complete"
        assert sum(len(m.chunk.token_ids) for m in first if m.HasField("chunk")) == 6
        second, again = generate(prompt + [11, 12, 13])  # the next turn extends the prompt
        assert again == replica
        assert second[-1].complete.cached_tokens > 0, second[-1].complete
        TIMINGS["grpc second turn cached_tokens"] = second[-1].complete.cached_tokens
    status = get_json(f"{router.admin_url}/status")
    assert status["total_inflight"] == 0 and status["affinity_kept"] >= 1
    metrics = scrape(router.admin_url)
    assert total(metrics, "rolloutrouter_requests_total", backend=replica, code="OK") >= 2


# --- a replica dies mid-stream (last: it kills replica a or b) ----------------------------------

def test_replica_killed_mid_stream_ends_the_stream_with_an_error(fleet):
    router, replicas = fleet
    client = client_for(router)
    max_tokens = 1900
    for attempt in range(2):  # a second try on the surviving replica if the first stream outran the kill
        stream = client.chat.completions.create(
            model=SERVED_MODEL, messages=[{"role": "user", "content": "a long answer please"}], max_tokens=max_tokens,
            extra_body=NO_EOS, stream=True, extra_headers={"X-Session-ID": f"doomed-{attempt}"})
        victim_url = stream.response.headers["x-rolloutrouter-replica"]
        victim = next(r for r in replicas if r.url == victim_url)
        chunks = iter(stream)
        next(chunks)
        killed_at = time.monotonic()
        victim.kill()
        received, error = [], None
        try:
            for chunk in chunks:
                received.append(chunk)
        except openai.APIError as raised:
            error = raised
        if error is not None:
            break
        tokens = sum(1 for c in received if c.choices and c.choices[0].delta.content is not None)
        finish = [c.choices[0].finish_reason for c in received if c.choices and c.choices[0].finish_reason]
        # A clean end is acceptable only if the whole answer had reached the router before the kill.
        assert finish == ["length"] and tokens >= max_tokens - 2, (
            f"the stream from the killed replica ended without an error after {tokens} tokens, finish {finish}")
        TIMINGS["killed replica: stream completed before the kill (retried)"] = attempt + 1
    else:
        pytest.fail("both streams completed before their replica was killed")
    TIMINGS["killed replica: chunks after the kill, before the error"] = len(received)
    TIMINGS["killed replica: error seen after (s)"] = round(time.monotonic() - killed_at, 3)
    TIMINGS["killed replica: client error"] = f"{type(error).__name__}: {error}"
    assert victim_url in str(error) and "mid-stream" in str(error), error
    wait_until(lambda: get_json(f"{router.admin_url}/status")["total_inflight"] == 0, what="in-flight back to 0")
    metrics = scrape(router.admin_url)
    assert total(metrics, "rolloutrouter_request_errors_total", reason="upstream_broke_mid_response") == 1
    assert total(metrics, "rolloutrouter_requests_total", backend=victim_url, code="502") == 1
    # The session's next turn finds the replica gone (connection refused) and is served elsewhere.
    raw = client.chat.completions.with_raw_response.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "again"}], max_tokens=4, extra_body=NO_EOS,
        extra_headers={"X-Session-ID": f"doomed-{attempt}"})
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-rolloutrouter-replica"] != victim_url
    status = get_json(f"{router.admin_url}/status")
    assert status["total_inflight"] == 0 and status["backends_ready"] == 1
