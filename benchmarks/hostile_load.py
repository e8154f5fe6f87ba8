"""Router memory under a hostile load, beside its idle baseline: RSS of a ``rollout-router serve`` process.

Two simulated replicas and one router run as real processes (``localfleet``). The
router's resident set size (VmRSS) is read after each phase, and its own gauges
(connections, buffered request bytes, refusals) from the admin listener's /metrics:

  idle          started, 100 ordinary chat requests answered
  idle conns    + ``--idle`` connections that never send a byte
  slow bodies   + ``--slow`` uploads declaring 32 MiB each that send 1 MiB and stall
  huge keys     + ``--keys`` requests with a 60 KiB session header and with a 1 MiB body key
  after         every hostile client gone, one sweep later

The router reads keys from the X-Session-ID header and the ``session_id`` body field; the limits are the
defaults (maxBufferedBytes 256 MiB, maxConnections 10,000, maxKeyBytes 256);
the router pod's default memory limit is 1 GiB.

    nice -n 10 .venv/bin/python benchmarks/hostile_load.py [--idle 2000] [--slow 400] [--keys 500]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import urllib.request

from rollout_router.localfleet import local_fleet

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def gauges(admin_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {'rolloutrouter_client_connections{listener="traffic"}': "connections",
              'rolloutrouter_buffered_request_bytes{listener="traffic"}': "buffered",
              'rolloutrouter_connections_rejected_total{listener="traffic"}': "rejected"}
    values = {name: 0.0 for name in wanted.values()}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            values[wanted[name]] = float(value)
    errors = sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                 if line.startswith("rolloutrouter_request_errors_total{"))
    return {**values, "errors": errors}


def request(body: bytes, extra: bytes = b"", length: int | None = None) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (extra, len(body) if length is None else length, body))


async def answer(host: str, port: int, data: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    try:
        line = await reader.readline()
        return int(line.split()[1]) if line else 0
    finally:
        writer.close()


async def run(args: argparse.Namespace, url: str, admin_url: str, pid: int) -> list[tuple[str, float, dict]]:
    host, port = url.removeprefix("http://").split(":")
    rows = []

    async def sample(phase: str) -> None:
        await asyncio.sleep(2.5)  # closes go out, a sweep and the kernel's accounting catch up
        rows.append((phase, rss_mib(pid), await asyncio.to_thread(gauges, admin_url)))

    body = json.dumps(CHAT).encode()
    codes = [await answer(host, int(port), request(body, b"X-Session-ID: s%d\r\n" % i)) for i in range(100)]
    assert set(codes) == {200}, codes
    await sample("idle")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(args.idle)]
    await sample(f"+ {args.idle} idle conns")
    megabyte = b"x" * (1 << 20)
    for _ in range(args.slow):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request(megabyte, length=32 << 20))
        held.append((reader, writer))
    await sample(f"+ {args.slow} slow 32 MiB bodies")
    header_key = b"X-Session-ID: " + b"k" * 60_000 + b"\r\n"
    body_key = json.dumps({**CHAT, "session_id": "k" * (1 << 20)}).encode()
    codes = await asyncio.gather(*(answer(host, int(port), request(body, header_key)) for _ in range(args.keys)),
                                 *(answer(host, int(port), request(body_key)) for _ in range(args.keys // 10)))
    await sample(f"+ {args.keys} 60 KiB header keys, {args.keys // 10} 1 MiB body keys")
    for _, writer in held:
        writer.close()
    await sample("after (all closed)")
    print(f"refusals of huge keys by status: { {c: codes.count(c) for c in sorted(set(codes))} }")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--slow", type=int, default=400)
    parser.add_argument("--keys", type=int, default=500)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the router inherits it
    with local_fleet(2, router_args=["--session-body-field", "session_id"]) as (router, _):
        assert router.admin_url is not None
        rows = asyncio.run(run(args, router.url, router.admin_url, router.process.pid))
    print("\n| phase | router RSS (MiB) | vs idle | client connections | buffered request bytes | "
          "connections refused | errors answered |")
    print("|---|---|---|---|---|---|---|")
    idle = rows[0][1]
    for phase, rss, values in rows:
        print(f"| {phase} | {rss:.0f} | {rss - idle:+.0f} | {values['connections']:.0f} | "
              f"{values['buffered'] / (1 << 20):.0f} MiB | {values['rejected']:.0f} | {values['errors']:.0f} |")


if __name__ == "__main__":
    main()
