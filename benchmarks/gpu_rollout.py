"""The seed study's question on real vLLM: sticky against a margin, paired steps of a verl-shaped rollout.

It starts N vLLM replicas of a model on the GPUs it finds (``--tp`` GPUs each; or takes running replicas' URLs with
``--urls``), one router per arm in front of them (``rollout-router serve``: sticky, and ``--margin``), and a client
shaped like verl's ``tool_agent`` loop: the whole batch of trajectories starts at once, each a multi-turn chat whose
turns carry its key (``X-Session-ID``), a turn of a log-normal length (``ignore_eos``) followed, with probability
``--tool-p``, by a fake tool call of ``--tool-seconds`` that appends ``--tool-tokens`` of text. A step is the
batch's makespan (verl's ``timing_s/generate_async``). Before each step every replica's prefix cache is reset (as a
trainer's weight update does; vLLM's ``/reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``, which this
script sets for the replicas it starts). Arms alternate step by step (paired: the same trajectories), and it prints
per arm the median step time, the paired change, and vLLM's own prefix-cache hit rate (its ``/metrics``), beside
the simulator's prediction for the same shape of rollout on ``--sim-fleet``.

    .venv/bin/python benchmarks/gpu_rollout.py --model Qwen/Qwen2.5-32B --tp 4 --steps 10 --trajectories 512
    .venv/bin/python benchmarks/gpu_rollout.py --urls http://10.0.0.5:8000 http://10.0.0.6:8000 --model NAME
    # the function test on the CPU build (docs/real-vllm.md; make test-vllm runs it):
    .venv/bin/python benchmarks/gpu_rollout.py --device cpu --vllm-python .venv-vllm/bin/python \\
        --model .cache/tiny-model --replicas 2 --steps 2 --trajectories 6 --out-tokens 8

No step time has been checked on GPUs yet: on the CPU it checks that everything runs and is measured.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from rollout_router.localfleet import spawn_router, stop, wait_healthy
from rollout_router.sim.stats import summarize
from rollout_router.sim.verlgrid import FLEETS, MARGINS, SEED_POINT, run_task
from rollout_router.sim.verlsources import TOOL_SLOTS

READY_SECONDS = 900.0  # a 32B model loads in minutes
LOOPBACK = "127.0.0.1"


@dataclasses.dataclass
class Trajectory:
    key: str
    outs: list[int]  # tokens per turn
    calls: int  # tool calls (every turn but the last)


def trajectories(args: argparse.Namespace, step: int) -> list[Trajectory]:
    """One step's batch, drawn from (seed, step): every arm replays it."""
    rng = random.Random(args.seed * 1_000_003 + step)
    batch = []
    for i in range(args.trajectories):
        outs = [max(1, int(rng.lognormvariate(0, args.sigma) * args.out_tokens))]
        while len(outs) < args.max_turns and rng.random() < args.tool_p:
            outs.append(max(1, int(rng.lognormvariate(0, args.sigma) * args.out_tokens)))
        batch.append(Trajectory(f"s{step}-t{i}", outs, len(outs) - 1))
    return batch


async def run_trajectory(http: aiohttp.ClientSession, url: str, model: str, t: Trajectory, args: argparse.Namespace,
                         sandbox: asyncio.Semaphore) -> None:
    messages = [{"role": "system", "content": "You are a careful solver; call the code tool when useful."},
                {"role": "user", "content": f"Problem {t.key}: " + "compute the sum of the digits " * 4}]
    for turn, out in enumerate(t.outs):
        body = {"model": model, "messages": messages, "max_tokens": out, "ignore_eos": True, "temperature": 1.0}
        async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": t.key}) as answer:
            answer.raise_for_status()
            text = (await answer.json())["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": text})
        if turn < t.calls:
            async with sandbox:  # the recipe's sandbox: at most TOOL_SLOTS calls at once
                await asyncio.sleep(args.tool_seconds)
            messages.append({"role": "user",  # (any chat template takes it; Qwen's renders a tool message so too)
                             "content": "<tool_response>" + "7 " * (args.tool_tokens // 2) + "</tool_response>"})


async def one_step(url: str, model: str, batch: list[Trajectory], args: argparse.Namespace) -> float:
    sandbox = asyncio.Semaphore(TOOL_SLOTS)
    limit = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=limit, timeout=aiohttp.ClientTimeout(total=None)) as http:
        started = time.monotonic()
        await asyncio.gather(*(run_trajectory(http, url, model, t, args, sandbox) for t in batch))
        return time.monotonic() - started


def prefix_counts(replicas: list[str]) -> tuple[float, float]:
    """vLLM's own cumulative prefix-cache (hits, queries) in tokens, summed over ``replicas``."""
    hits = queries = 0.0
    for url in replicas:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def reset_prefix_caches(replicas: list[str]) -> bool:
    """Empty every replica's prefix cache (a new step's weights); False where a replica does not serve it."""
    done = True
    for url in replicas:
        request = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.URLError:
            done = False
    return done


def gpus() -> int:
    """GPUs ``nvidia-smi`` lists here (0 without it)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_replicas(args: argparse.Namespace, logs: Path) -> Iterator[list[str]]:
    """The replicas: ``--urls`` as given, or vLLM servers started here (each in its own process group)."""
    if args.urls:
        yield args.urls
        return
    processes: list[subprocess.Popen] = []
    urls = []
    try:
        for i in range(args.replicas):
            port = free_port()
            env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
            extra = ["--tensor-parallel-size", str(args.tp)]
            if args.device == "cpu":
                env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                            "VLLM_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1))})  # a core each
                extra = ["--enforce-eager", "--max-model-len", "2048"]
            else:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i * args.tp + g) for g in range(args.tp))
            for name in ("VIRTUAL_ENV", "PYTHONPATH"):
                env.pop(name, None)
            command = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
                       "--served-model-name", args.served_model_name, "--host", LOOPBACK, "--port", str(port),
                       "--enable-prefix-caching", *extra]
            log = (logs / f"vllm-{i}.log").open("w")
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              stdin=subprocess.DEVNULL, start_new_session=True))
            urls.append(f"http://{LOOPBACK}:{port}")
        deadline = time.monotonic() + READY_SECONDS
        for url, process, i in zip(urls, processes, range(len(urls))):
            while not _healthy(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM replica {i} did not start (its log: {logs / f'vllm-{i}.log'})")
                time.sleep(1)
        yield urls
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def predicted(args: argparse.Namespace, replicas: int) -> dict[str, float]:
    """The simulator's paired change of margin against sticky, and its prefix hits, for this shape of rollout on
    ``--sim-fleet`` (verl's balancer, the seed study's ``verl_sticky`` and ``verl_margin{M}``), over the steps."""
    point = dataclasses.replace(SEED_POINT, fleet=args.sim_fleet, out=float(args.out_tokens), tool_p=args.tool_p,
                                latency=args.tool_seconds, replicas=replicas, sigma=args.sigma,
                                batch=max(1, args.trajectories // replicas), tool_tokens=args.tool_tokens,
                                max_turns=args.max_turns, tool_slots=TOOL_SLOTS if args.tool_seconds else None)
    arm = f"verl_margin{args.margin:g}"
    sticky = [run_task((point, "verl_sticky", s, args.seed)) for s in range(args.steps)]
    margin = [run_task((point, arm, s, args.seed)) for s in range(args.steps)]
    change = summarize([r["step_seconds"] for r in margin], [r["step_seconds"] for r in sticky])
    return {"change": change["median"], "hit_sticky": statistics.mean(r["hit_rate"] for r in sticky),
            "hit_margin": statistics.mean(r["hit_rate"] for r in margin), "point": point.label}


def measure(args: argparse.Namespace) -> int:
    logs = Path(tempfile.mkdtemp(prefix="gpu-rollout-"))
    arms = {"sticky": ["--affinity-break-margin", "null"], f"margin {args.margin:g}":
            ["--affinity-break-margin", f"{args.margin:g}"]}
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    hits: dict[str, list[float]] = {arm: [] for arm in arms}
    with vllm_replicas(args, logs) as replicas:
        routers = {arm: spawn_router(replicas, flags).bound() for arm, flags in arms.items()}
        try:
            for router in routers.values():
                wait_healthy(router, "/readyz", timeout=120)
            resets = True
            for step in range(args.steps):
                batch = trajectories(args, step)
                order = list(arms) if step % 2 == 0 else list(reversed(arms))  # neither arm always runs first
                for arm in order:
                    resets &= reset_prefix_caches(replicas)
                    before = prefix_counts(replicas)
                    times[arm].append(asyncio.run(one_step(routers[arm].url, args.served_model_name, batch, args)))
                    after = prefix_counts(replicas)
                    hits[arm].append((after[0] - before[0]) / max(1.0, after[1] - before[1]))
                print(f"step {step + 1}/{args.steps}: " + ", ".join(f"{a} {times[a][-1]:.1f} s" for a in arms),
                      flush=True)
        finally:
            for router in routers.values():
                stop(router.process)
    sim = predicted(args, len(replicas))
    sticky, margin = arms
    change = summarize(times[margin], times[sticky])
    print(f"\n{len(replicas)} replicas, {args.trajectories} trajectories a step, {args.steps} paired steps"
          + ("" if resets else " (a replica would not reset its prefix cache: steps share it)"))
    print(f"{'arm':>10} {'median step s':>14} {'vLLM prefix hit':>16} {'simulated hit':>14}")
    print(f"{sticky:>10} {statistics.median(times[sticky]):>14.2f} {statistics.mean(hits[sticky]):>16.1%} "
          f"{sim['hit_sticky']:>14.1%}")
    print(f"{margin:>10} {statistics.median(times[margin]):>14.2f} {statistics.mean(hits[margin]):>16.1%} "
          f"{sim['hit_margin']:>14.1%}")
    print(f"paired change of {margin} against sticky: measured {change['median']:+.1%} "
          f"({change['wins']}/{change['n']} steps faster, sign test p={change['sign_p']:.2g}); "
          f"simulated ({sim['point']}): {sim['change']:+.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model vLLM serves (a path, or a name it can load)")
    parser.add_argument("--urls", nargs="+", help="running vLLM replicas instead of starting them")
    parser.add_argument("--replicas", type=int, help="replicas to start (default: the GPUs found / --tp)")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per replica (default 1)")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                        help="cpu: start vLLM's CPU build (the function test), one replica per --replicas")
    parser.add_argument("--vllm-python", default=sys.executable, help="the interpreter with vLLM (default: this one)")
    parser.add_argument("--served-model-name", default="model")
    parser.add_argument("--margin", type=int, choices=MARGINS, default=2,
                        help="the margin arm's affinityBreakMargin (default 2; one the simulator's grid has)")
    parser.add_argument("--steps", type=int, default=10, help="paired steps (default 10)")
    parser.add_argument("--trajectories", type=int, default=64, help="trajectories a step, fleet-wide (default 64)")
    parser.add_argument("--out-tokens", type=int, default=1024, help="a turn's median length (default 1024)")
    parser.add_argument("--sigma", type=float, default=1.0, help="its log-normal spread (default 1.0)")
    parser.add_argument("--tool-p", type=float, default=0.9, help="chance a turn ends in a tool call (default 0.9)")
    parser.add_argument("--tool-seconds", type=float, default=0.0, help="the fake tool's latency (default 0)")
    parser.add_argument("--tool-tokens", type=int, default=256, help="a tool result's length (default 256)")
    parser.add_argument("--max-turns", type=int, default=8, help="max_assistant_turns (default 8)")
    parser.add_argument("--sim-fleet", choices=sorted(FLEETS), default="32b-tp4-0.8",
                        help="the simulated fleet the prediction is for (default 32b-tp4-0.8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "trajectories", "out_tokens", "max_turns", "tp"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.replicas is None and not args.urls:
        found = gpus()
        if args.device == "cpu":
            args.replicas = 1
        elif found < args.tp:
            parser.error(f"found {found} GPUs, need --tp {args.tp} per replica: give --urls, or --device cpu")
        else:
            args.replicas = found // args.tp
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
