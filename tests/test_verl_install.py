"""The router installed into verl's own environment (docs/integrations.md, "Installing into verl's environment").

`make install-test` has pip resolve verl 0.9.1 with its vLLM pins together with the router (metadata only) and
builds a small virtualenv holding the router at the versions that resolution chose (tests/tools/verl_env.py).
These tests read what pip decided and import the plugin in that environment, as verl's Ray actor does.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / ".venv-verl-resolve.json"
STATUS = ROOT / ".venv-verl-resolve.status.json"
PYTHON = ROOT / ".venv-verl" / "bin" / "python"


@pytest.fixture(scope="module")
def chosen() -> dict[str, dict]:
    """Each package pip chose (canonical name -> its metadata); the test fails if the resolution failed."""
    assert STATUS.is_file(), "no resolution of verl with the router: run `make install-test`"
    status = json.loads(STATUS.read_text())
    assert status["returncode"] == 0, "pip could not install the router beside verl[vllm]==0.9.1:\n" + \
        "\n".join(status["stderr"])
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]
            for item in json.loads(REPORT.read_text())["install"]}


def _satisfied(requirement: str, chosen: dict[str, dict], extra: str = "") -> bool:
    """Whether the resolved set meets one Requires-Dist line (lines whose marker does not apply count as met)."""
    req = Requirement(requirement)
    if req.marker and not req.marker.evaluate({**default_environment(), "extra": extra}):
        return True
    found = chosen.get(canonicalize_name(req.name))
    return found is not None and req.specifier.contains(Version(found["version"]), prereleases=True)


def test_pip_resolves_the_router_with_verls_own_pins(chosen):
    """verl 0.9.1's pins for a vLLM node (torch, vLLM, transformers, ...) all hold, and so does every requirement
    of the router's core install: no conflict, nothing downgraded below what either asks."""
    verl, router = chosen["verl"], chosen["rollout-router"]
    assert verl["version"] == "0.9.1"
    pins = [r for r in verl["requires_dist"] if "==" in r and 'extra == "vllm"' in r]
    assert {Requirement(p).name for p in pins} >= {"torch", "vllm", "transformers"}, pins
    assert all(_satisfied(p, chosen, extra="vllm") for p in pins), [p for p in pins if not _satisfied(p, chosen, "vllm")]
    told = (ROOT / "docs/integrations.md").read_text()
    assert all(f"{name} {chosen[name]['version']}" in told for name in ("torch", "transformers")), "docs' pins"
    assert f"vLLM {chosen['vllm']['version']}" in told
    core = [r for r in router["requires_dist"] if "extra ==" not in r]
    assert core and all(_satisfied(r, chosen) for r in core), [r for r in core if not _satisfied(r, chosen)]


def test_the_plugin_imports_and_decides_in_that_environment(chosen):
    """In a virtualenv holding the router at the versions pip chose beside verl, verl's router YAML class loads and
    pins a trajectory's turns; the router's dependencies there are the resolved versions."""
    assert PYTHON.is_file(), "no virtualenv of verl's environment: run `make install-test`"
    script = """
import importlib, json, importlib.metadata as md
module, name = "rollout_router.integrations.verl.AffinityLoadBalancer".rsplit(".", 1)
lb = getattr(importlib.import_module(module), name)({"a": "handle-a", "b": "handle-b"},
                                                     {"router_class": f"{module}.{name}", "affinity_break_margin": 8})
first = [lb.acquire_server("trajectory-1")[0] for _ in range(3)]
versions = {d.metadata["Name"].lower(): d.version for d in md.distributions()}
print(json.dumps({"servers": first, "status": lb.get_status(), "versions": versions}))
"""
    done = subprocess.run([str(PYTHON), "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert len(set(answer["servers"])) == 1 and answer["status"]["affinity_kept"] == 2
    assert answer["versions"]["verl"] == "0.9.1"
    differ = {name: (version, chosen[canonicalize_name(name)]["version"]) for name, version in answer["versions"].items()
              if canonicalize_name(name) in chosen and name not in ("pip", "setuptools")
              and Version(version) != Version(chosen[canonicalize_name(name)]["version"])}
    assert not differ, differ
