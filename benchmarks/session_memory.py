"""Router memory with many pinned sessions: RSS of a router process holding 1,000,000 pins.

A real ``Runtime`` (everything ``rollout-router serve`` imports and builds, 16 replicas, the default
affinity policy) routes one request for each of ``--sessions`` distinct session keys (36-character
UUIDs, as RL frameworks use for rollout ids) through the balancer, leasing and releasing like the
proxy does; then it reports the process's resident set size (VmRSS) before and after, and the
bytes per pin. Target: 1,000,000 pins in at most 256 MiB of router RSS.

    .venv/bin/python benchmarks/session_memory.py [--sessions 1000000]
"""
from __future__ import annotations

import argparse
import gc
import uuid


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    args = parser.parse_args()
    from rollout_router.app import Runtime
    from rollout_router.settings import RouterSettings
    settings = RouterSettings(backends=[f"http://10.0.0.{i}:8000" for i in range(16)],
                              session={"maxSessions": args.sessions})
    runtime = Runtime(settings)
    runtime.apply(settings)
    gc.collect()
    before = rss_mib()
    keys = (str(uuid.UUID(int=i, version=4)) for i in range(args.sessions))
    for key in keys:
        runtime.balancer.acquire(key)[1].release()
    gc.collect()
    after = rss_mib()
    pins = runtime.balancer.policy.sessions()
    print(f"pins {pins:,}  router RSS {after:.0f} MiB (before the pins {before:.0f} MiB)  "
          f"{(after - before) * 2**20 / pins:.0f} bytes per pin, key included  "
          f"target <= 256 MiB: {'met' if after <= 256 else 'MISSED'}")


if __name__ == "__main__":
    main()
