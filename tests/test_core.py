"""The core's two builds: compiled where a C compiler is (and as new as its sources), the Python source elsewhere,
deciding alike. (The policy, load index and tally tests run on both builds: ``make test`` runs them again with
``ROLLOUT_ROUTER_CORE=python``.)"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rollout_router import core
from rollout_router.core import budget, sources, tallies

ROOT = Path(__file__).resolve().parent.parent
COMPILED_MODULES = tuple(importlib.import_module(f"rollout_router.core.{name}") for name in sources.COMPILED)

# A seeded run of the router's hot state: sessions routed by the margin policy over a replica set whose counts
# the ledger keeps, requests ended out of order, a replica marked down and back, a reload of the margin. What a
# user sees of it is printed: every decision, the pins, the loads, the counters.
DRIVE = r"""
import json, random, sys
from rollout_router import core
from rollout_router.balancer import Balancer
from rollout_router.policy import LiveConfig
from rollout_router.replicas import ReplicaSet
now = [0.0]
clock = lambda: now[0]
replicas = ReplicaSet(clock=clock)
for i in range(6):
    replicas.add(f"http://r{i}")
balancer = Balancer(replicas, "affinity", LiveConfig(margin=2), clock=clock)
rng, held, seen = random.Random(7), [], []
for step in range(3000):
    now[0] += rng.random() * 0.2
    if step == 1000:
        balancer.apply("affinity", LiveConfig(margin=0, idle_ttl=30.0))
    if step == 2000:
        balancer.apply("affinity", LiveConfig(margin=None))
    if step % 400 == 7:
        replicas.mark_down(f"http://r{step % 6}", 5)
    if held and rng.random() < 0.45:
        replicas.put(held.pop(rng.randrange(len(held))))
        continue
    key = f"s{rng.randrange(60)}"
    decision, replica = balancer.take(key)
    held.append(replica)
    seen.append([decision.replica, decision.outcome.value, decision.previous])
policy = balancer.policy
print(json.dumps({"compiled": core.COMPILED, "decisions": seen, "pins": policy.pins(now[0]),
                  "loads": sorted(replicas.loads().items()), "counters": policy.counters.as_dict()}))
"""


def drive(**env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def compiler() -> str | None:
    name = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(name)


def test_the_core_is_compiled_and_as_new_as_its_sources_where_there_is_a_c_compiler():
    if compiler() is None:
        pytest.skip("no C compiler here: the core runs its Python source")
    if os.environ.get(core.ENV) == "python":
        pytest.skip(f"{core.ENV}=python: this run is the Python build's")
    assert core.COMPILED, core.WHY_PYTHON
    assert all(not module.__file__.endswith(".py") for module in COMPILED_MODULES)


def test_both_builds_decide_alike():
    """The compiled core and its Python source make the same decisions and leave the same pins, loads and counts."""
    source = drive(**{core.ENV: "python"})
    assert source["compiled"] is False
    built = drive()
    assert built["compiled"] is core.COMPILED
    assert source["decisions"] and len(source["decisions"]) == len(built["decisions"])
    assert built == {**source, "compiled": built["compiled"]}
    outcomes = {outcome for _, outcome, _ in source["decisions"]}
    assert {"new", "kept", "broken", "repinned"} <= outcomes  # the run meets every rule


def test_a_build_older_than_its_sources_is_not_run(tmp_path):
    """An edit after the build runs the edited source (the lane, which calls the compiled core, steps aside)."""
    if not core.COMPILED:
        pytest.skip(f"the core runs its Python source here ({core.WHY_PYTHON})")
    copy = tmp_path / "rollout_router"
    shutil.copytree(ROOT / "router" / "rollout_router", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "core" / "pins.py").open("a") as edited:
        edited.write("\n# an edit after the build\n")
    probe = ("from rollout_router import core; from rollout_router.core import pins; "
             "from rollout_router.proxy.http import lane; print(core.WHY_PYTHON); print(pins.__file__); "
             "print(lane.unavailable())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    why, where, lane = done.stdout.splitlines()
    assert "older than its sources" in why and where == str(copy / "core" / "pins.py")
    assert "core runs its Python source" in lane


def test_the_python_build_is_chosen_by_its_variable():
    done = subprocess.run([sys.executable, "-c", "from rollout_router import core; from rollout_router.core import "
                           "kept; print(core.WHY_PYTHON); print(kept.__file__)"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, core.ENV: "python"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{core.ENV}=python", str(ROOT / "router/rollout_router/core/kept.py")]


def test_the_sampler_measures_every_nth_kept_turn():
    sampler = tallies.Sampler()
    sampler.rate = 0.25
    assert [sampler.sample() for _ in range(8)] == [False, False, False, True] * 2


def test_the_listeners_share_one_byte_budget_and_each_counts_its_own():
    shared = budget.Budget()
    http, grpc = budget.Share(shared), budget.Share(shared)
    assert http.charge(600, 1000) and not grpc.charge(401, 1000)  # refused: nothing counted
    assert (shared.held, http.buffered, grpc.buffered) == (600, 600, 0)
    assert grpc.charge(400, 1000)  # up to the limit, not beyond
    grpc.hold(50)  # held whatever the limit
    assert (shared.held, http.buffered, grpc.buffered) == (1050, 600, 450)
    http.release(600)
    grpc.release(450)
    assert (shared.held, http.buffered, grpc.buffered) == (0, 0, 0)
