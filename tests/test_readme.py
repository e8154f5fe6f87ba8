"""The README is a newcomer's first ten minutes: short, every link alive, and its commands run as written.

The "Try it by hand" steps run here in one bash script, only with free ports in place of 8001, 8002, 8080 and
8081 (other routers may hold those on a shared machine) and a wait for the router's readiness between the
steps, as a user waits for the ``listening on`` lines. The Kubernetes steps run in ``make test-k8s``
(tests/realk8s/test_readme_steps.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from rollout_router.localfleet import free_port
from rollout_router.settings import Backend, LabelSelector, RouterSettings, parse_settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def blocks(text: str, heading: str) -> list[tuple[str, str]]:
    """The fenced code blocks (language, body) of the section under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) < 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, missing


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "index.md").read_text()
    assert not [p.name for p in PAGES[1:] if p.name != "index.md" and f"({p.name})" not in index]


def setting_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key of a settings model as the file spells it, sections included (a label selector is one key)."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        keys.append(key)
        sections = [t for t in typing.get_args(field.annotation) or (field.annotation,)
                    if isinstance(t, type) and issubclass(t, BaseModel) and t not in (LabelSelector, Backend)]
        keys += setting_keys(sections[0], key + ".") if sections else []
    return keys


def test_the_configuration_page_lists_every_key():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert not [key for key in setting_keys(RouterSettings) if f"| `{key}` |" not in text]


def test_the_readme_examples_are_valid():
    text = README.read_text()
    (config,) = [body for lang, body in blocks(text, "Configure") if lang == "yaml"]
    parse_settings(yaml.safe_load(config))
    resource = [body for lang, body in blocks(text, "On Kubernetes") if lang == "yaml"][0]
    assert yaml.safe_load(resource) == yaml.safe_load((ROOT / "docs/examples/rolloutrouter.yaml").read_text())


def test_try_it_by_hand_runs_as_written(tmp_path):
    (start, stop), (client,) = ([body for lang, body in blocks(README.read_text(), "Try it by hand") if lang == want]
                                for want in ("sh", "python"))
    ports = {port: str(free_port("127.0.0.1")) for port in ("8001", "8002", "8080", "8081")}
    start = start.replace("rollout-router serve", "rollout-router serve --admin-port 8081")  # the default, pinned
    script = "\n".join([
        "set -e", start,
        "for i in $(seq 300); do curl -sf http://127.0.0.1:8081/readyz >/dev/null && break; sleep 0.1; done",
        f"{sys.executable} - <<'PYTHON'\n{client}PYTHON", stop, "wait"])
    script = re.sub(r"\b(8001|8002|8080|8081)\b", lambda m: ports[m.group()], script)  # one pass: no re-replacing
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    replica = f"http://127.0.0.1:{ports['8001']}"
    assert re.search(rf"^({replica}|http://127.0.0.1:{ports['8002']}) \S", done.stdout, re.M), done.stdout
    assert '"affinity_kept"' in done.stdout and '"backends"' in done.stdout
