"""The core install runs the router and the simulated replica; every other command names its extra.

The test virtualenv has every extra installed, so the subprocesses here run with a sitecustomize on
PYTHONPATH that puts None in sys.modules for each extra's packages: ``import numpy`` then raises
ModuleNotFoundError and ``importlib.util.find_spec("numpy")`` answers None, as on a core-only install.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rollout_router import cli
from rollout_router.localfleet import local_fleet

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "rollout-router"  # the installed console script, as a user runs it
EXTRA_MODULES = sorted(module for modules in cli.EXTRAS.values() for module in modules)
NEEDS_EXTRA = [(name, command.extra) for name, command in cli.SUBCOMMANDS.items() if command.extra]


def optional_dependencies() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {extra: [Requirement(r) for r in reqs] for extra, reqs in project["optional-dependencies"].items()}


@pytest.fixture
def without_extras(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every subprocess started while this is active sees a core-only install."""
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nfor name in {EXTRA_MODULES!r}:\n    sys.modules[name] = None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_extras_are_the_ones_pyproject_declares():
    """cli.EXTRAS (import names, checked before a command runs) lists the packages of pyproject's extras."""
    declared = optional_dependencies()
    installed = packages_distributions()
    for extra, modules in cli.EXTRAS.items():
        distributions = {dist.lower() for module in modules for dist in installed[module]}
        assert distributions == {r.name.lower() for r in declared[extra]}, extra
    assert {extra for _, extra in NEEDS_EXTRA} <= cli.EXTRAS.keys()
    (itself,) = [r for r in declared["test"] if r.name == "rollout-router"]
    assert itself.extras == cli.EXTRAS.keys(), "the [test] extra installs every other extra"


def test_the_blocker_hides_every_extra(without_extras):
    """Guards the tests below: without it they would pass on an install that has the extras."""
    probe = run(sys.executable, "-c", "import importlib.util, sys; "
                f"print(all(importlib.util.find_spec(m) is None for m in {EXTRA_MODULES!r})); import numpy")
    assert probe.stdout == "True\n"
    assert "ModuleNotFoundError" in probe.stderr


@pytest.mark.parametrize("args", [["serve", "--help"], ["fake-vllm", "--help"], ["crd"]])
def test_core_commands_run_on_the_core_install(without_extras, args):
    done = run(str(SCRIPT), *args)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout


def test_router_and_fake_vllm_serve_traffic_on_the_core_install(without_extras):
    """Real processes, every extra unimportable: a chat completion goes through the router to a replica."""
    with local_fleet(1) as (router, _replicas):
        request = urllib.request.Request(
            router.url + "/v1/chat/completions", method="POST", headers={"X-Session-ID": "s-1"},
            data=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert json.load(response)["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("name", "extra"), NEEDS_EXTRA)
@pytest.mark.parametrize("flags", [[], ["--help"]])
def test_a_missing_extra_is_one_line_not_a_traceback(without_extras, name, extra, flags):
    """Exit 2 with the install command; a command whose flags need nothing of the extra still shows --help."""
    done = run(str(SCRIPT), name, *flags)
    if flags and not cli.SUBCOMMANDS[name].flags_need_extra:
        assert (done.returncode, done.stderr) == (0, "") and "usage: rollout-router " + name in done.stdout
        return
    missing = ", ".join(cli.EXTRAS[extra])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"rollout-router {name}: needs the [{extra}] extra ({missing} not installed): "
                           f"pip install 'rollout-router[{extra}]' (from a checkout: pip install -e '.[{extra}]')\n")


def test_operator_help_needs_no_extra(without_extras):
    done = run(str(SCRIPT), "operator", "--help")
    assert done.returncode == 0 and "--namespace" in done.stdout and "--metrics-port" in done.stdout


def test_the_core_modules_import_no_extra():
    """Every router module but the simulator's and the demo's, and the crd command, with the extras
    installed: none of them is imported (the check itself sees numpy once the simulator is imported)."""
    script = """
import importlib, json, pkgutil, sys
import rollout_router
extras = %r
core, packages = [], [(rollout_router.__path__, "rollout_router.")]
while packages:  # pkgutil.walk_packages would import the simulator's package to look inside it
    path, prefix = packages.pop()
    for m in pkgutil.iter_modules(path, prefix):
        if m.name not in ("rollout_router.sim", "rollout_router.demo"):
            core.append(m.name)
            module = importlib.import_module(m.name)
            if m.ispkg:
                packages.append((module.__path__, m.name + "."))
importlib.import_module("rollout_router_operator.cli_crd")
loaded = lambda: sorted({m.split(".")[0] for m in sys.modules} & set(extras))
before = loaded()
importlib.import_module("rollout_router.sim")
print(json.dumps({"core": core, "before": before, "after_sim": loaded()}))
""" % (EXTRA_MODULES,)
    done = run(sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert {"rollout_router.serve", "rollout_router.app", "rollout_router.fakevllm.api"} <= set(found["core"])
    assert found["before"] == []
    assert "numpy" in found["after_sim"]


LIBRARIES = ["aiohttp", "pydantic", "prometheus_client", "yaml", "httptools", "grpc", "kopf", "kubernetes",
             "numpy", "matplotlib.pyplot"]


def source_modules() -> list[str]:
    """Every module of both packages, named from the source tree (nothing is imported to find them)."""
    names = []
    for root in (ROOT / "router" / "rollout_router", ROOT / "operator" / "rollout_router_operator"):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if parts[-1] != "__main__":  # runs the simulator's CLI: `python -m`, never imported
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """An import that works only after some other module was imported first (a circle hidden by the order
    in a package's __init__) fails here: each module is imported by itself, in a child forked from an
    interpreter that has imported none of the project's modules (only the heavier libraries they use,
    loaded once before the children so that the check takes seconds, not a minute)."""
    script = """
import importlib, os, sys, traceback
for library in %r:
    importlib.import_module(library)
running, failed = {}, []
def reap():
    pid, status = os.wait()
    name = running.pop(pid)
    if os.waitstatus_to_exitcode(status) != 0:
        failed.append(name)
for name in sys.argv[1:]:
    if len(running) >= (os.cpu_count() or 1):
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    reap()
print(" ".join(failed))
""" % (LIBRARIES,)
    modules = source_modules()
    assert "rollout_router.fleet.node" in modules and "rollout_router_operator.cli" in modules
    done = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], done.stderr
