"""AffinityLoadBalancer driven by verl's own code (the release pinned in the Makefile) on a local Ray.

verl builds the balancer (``LLMServerManager`` -> ``get_router_handle``, from a router YAML or a
``load_balancer_cls``), wraps it in ``ray.remote`` and calls it from ``LLMServerClient.generate``:
the field declarations once, ``acquire_server`` per turn, a fire-and-forget ``release_server``.

verl's package ``__init__`` files import torch and transformers (``verl.protocol``, the rollout
backends), which ``make test`` does not install (verl is installed without its dependencies). So
the verl packages are entered as bare packages over the installed files, and the four modules
``llm_server.py`` imports names from for launching replicas and worker groups (torch-backed, never
run here) are entered as name-only stand-ins. Every line that runs on the paths below is verl's
file as shipped; the servers behind the balancer are small Ray actors with vLLM's ``generate``
signature.
"""
from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import yaml
from omegaconf import OmegaConf

from rollout_router.integrations.verl import NO_SERVERS, AffinityLoadBalancer
from rollout_router.sim.parallel import start_ray

from .support import wait_for

VERL_VERSION = "0.9.1"  # the Makefile installs this release (VERL_VERSION)


def _import_verl() -> tuple[types.ModuleType, types.ModuleType]:
    """verl's ``router`` and ``llm_server`` modules, imported without torch."""
    assert importlib.metadata.version("verl") == VERL_VERSION, "run `make test`: it installs the pinned verl"
    root = Path(importlib.util.find_spec("verl").origin).parent
    for name in ("verl", "verl.utils", "verl.workers", "verl.workers.rollout",
                 "verl.single_controller", "verl.single_controller.ray"):
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    stand_ins = {
        "verl.single_controller.ray.base": ["RayResourcePool", "RayWorkerGroup"],
        "verl.utils.tracking": ["RLInsightLogger"],
        "verl.workers.rollout.replica": ["RolloutReplica", "TokenOutput", "get_rollout_replica_class"],
        "verl.workers.rollout.utils": ["update_prometheus_config"],
    }
    for name, attributes in stand_ins.items():
        module = sys.modules[name] = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, None)
    sys.modules["verl.utils"].normalize_token_ids = None
    return (importlib.import_module("verl.workers.rollout.router"),
            importlib.import_module("verl.workers.rollout.llm_server"))


verl_router, llm_server = _import_verl()
PLUGIN = f"{AffinityLoadBalancer.__module__}.{AffinityLoadBalancer.__name__}"


class Manager(llm_server.LLMServerManager):
    """verl's manager; ``create_empty`` launches no replica, so no replica class is looked up."""

    rollout_replica_class = None  # verl's own hook ("for recipe to change")


@pytest.fixture(scope="module")
def servers():
    """Two server actors, as verl's ``{address: handle}`` registry holds them."""
    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)

    class Server:  # defined here so Ray ships it by value (workers need not import the tests)
        """vLLM's ``generate`` signature; counts the turns it served."""

        def __init__(self) -> None:
            self.turns = 0

        def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            self.turns += 1
            return SimpleNamespace(token_ids=[7], extra_fields={})

        def served(self) -> int:
            return self.turns

    actor = ray.remote(Server)
    yield {"srv-0": actor.remote(), "srv-1": actor.remote()}
    ray.shutdown()


def rollout_config(**rollout) -> OmegaConf:
    """The parts of verl's trainer config that ``LLMServerManager`` and its client read."""
    base = {"name": "vllm", "nnodes": 1, "full_determinism": False, "disaggregation": {"enabled": False}}
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {**base, **rollout}, "model": {}}})


def router_yaml(tmp_path: Path, **options) -> str:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"router_class": PLUGIN, **options}))
    return str(path)


async def settled(lb) -> dict:
    """The balancer's status once every fire-and-forget release has landed."""
    done = {}

    def idle() -> bool:
        done.update(ray.get(lb.get_status.remote()))
        return done["total_inflight"] == 0

    await wait_for(idle, timeout=30)
    return done


async def test_a_router_yaml_makes_verls_client_route_through_our_policy(servers, tmp_path):
    config = rollout_config(router_config_path=router_yaml(tmp_path, affinity_break_margin=2))
    manager = await Manager.create_empty(config)
    lb = manager.global_load_balancer
    await lb.add_servers.remote(servers)  # how verl registers hybrid replicas at run time
    client = manager.get_client()
    for _ in range(4):
        output = await client.generate("traj-a", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 1})
        assert output.token_ids == [7]
    status = await settled(lb)
    assert status["affinity_break_margin"] == 2
    assert (status["new_sessions"], status["affinity_kept"], status["affinity_broken"]) == (1, 3, 0)
    served = sorted(await asyncio.gather(*(handle.served.remote() for handle in servers.values())))
    assert served == [0, 4]  # every turn of the trajectory on one server
    ray.kill(lb)


async def test_load_balancer_cls_breaks_a_pin_beyond_the_margin(servers):
    configured = AffinityLoadBalancer.configured(affinity_break_margin=0)
    manager = await Manager.create_empty(rollout_config(), load_balancer_cls=configured)
    lb = manager.global_load_balancer
    await lb.add_servers.remote(servers)
    client = manager.get_client()
    first, _ = await client._acquire_server("traj-b", prompt_ids=[1])
    second, handle = await client._acquire_server("traj-b", prompt_ids=[1, 2])  # first still in flight
    assert second != first
    assert handle == servers[second]
    client._release_server(first, request_id="traj-b")
    client._release_server(second, request_id="traj-b")
    status = await settled(lb)
    assert (status["affinity_kept"], status["affinity_broken"]) == (0, 1)
    ray.kill(lb)


async def test_verls_client_hands_a_request_group_id_to_the_balancer(servers):
    """verl's client sends only the fields the balancer declares: ``request_group_id`` reaches it, the prompt not."""
    manager = await Manager.create_empty(rollout_config(), load_balancer_cls=AffinityLoadBalancer.configured())
    lb = manager.global_load_balancer
    await lb.add_servers.remote(servers)
    client = manager.get_client()
    placed = [await client._acquire_server(f"sample-{i}", prompt_ids=[1, 2], request_group_id="uid-1")
              for i in range(4)]  # all four in flight: without the group they would alternate
    assert len({server_id for server_id, _ in placed}) == 1
    for server_id, _ in placed:
        client._release_server(server_id, request_id="x")
    status = await settled(lb)
    assert (status["new_sessions"], status["group_colocated"], status["group_spilled"]) == (4, 3, 0)
    ray.kill(lb)


async def test_verls_async_client_waits_on_an_empty_pool_until_servers_are_added(servers, tmp_path):
    manager = await Manager.create_empty(rollout_config(router_config_path=router_yaml(tmp_path)))
    lb = manager.global_load_balancer
    with pytest.raises(RuntimeError, match=NO_SERVERS):  # the plain client fails at once ...
        await manager.get_client()._acquire_server("traj-c")
    waiting = manager.get_client(llm_server.FullyAsyncLLMServerClient, only_hybrid=True)
    acquired = asyncio.ensure_future(waiting._acquire_server("traj-c"))
    # ... the hybrid-only client retries: its first acquire RPC is sent once its field declarations
    # are cached, and Ray runs one caller's calls to an actor in order, so it meets the empty pool.
    await wait_for(lambda: waiting._lb_require_acquire_fields is not None, timeout=30)
    await lb.add_servers.remote(servers)
    server_id, _ = await asyncio.wait_for(acquired, timeout=30)
    assert server_id in servers
    ray.kill(lb)


def parameters(function) -> list[str]:
    """Parameter names as written: ``ray.remote`` rewrites a class's methods in place, adding
    a keyword-only ``_ray_trace_ctx``, and the Ray tests above have passed ours to it."""
    return [name for name in inspect.signature(function).parameters if name != "_ray_trace_ctx"]


@pytest.mark.parametrize("method", sorted(
    name for name, _ in inspect.getmembers(verl_router.GlobalRequestLoadBalancer, inspect.isfunction)
    if not name.startswith("_")
))
def test_every_public_method_of_verls_balancer_is_here_with_its_parameters(method):
    ours = parameters(getattr(AffinityLoadBalancer, method))
    for theirs in (verl_router.GlobalRequestLoadBalancer, verl_router.RequestLoadBalancer):
        if hasattr(theirs, method):
            expected = parameters(getattr(theirs, method))
            assert ours[:len(expected)] == expected, theirs.__name__
