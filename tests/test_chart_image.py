"""The container images' Dockerfile (no Docker engine runs here): its two targets (router, operator) and
what each installs, and that the files it copies build the package with both commands."""
from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from rollout_router_operator.render import RUN_AS
from rollout_router_operator.spec import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|python3?-dev|libc6?-dev|apt-get install)\b")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


class Stage(NamedTuple):
    name: str
    base: str  # the FROM image, or an earlier stage's name
    body: list[tuple[str, str]]  # its instructions after FROM


def stages() -> dict[str, Stage]:
    """The build stages by name, in order."""
    result: dict[str, Stage] = {}
    for word, rest in instructions():
        if word == "FROM":
            base, _, name = rest.partition(" AS ")
            result[name.strip()] = Stage(name.strip(), base.strip(), [])
        elif result:
            next(reversed(result.values())).body.append((word, rest))
    return result


def image(target: str) -> list[tuple[str, str]]:
    """What an image built with --target holds: its stage and the stages it is FROM, up to the base image."""
    all_stages = stages()
    body: list[tuple[str, str]] = []
    while target in all_stages:
        body = all_stages[target].body + body
        target = all_stages[target].base
    return body


def installs(target: str) -> list[str]:
    """The `pip install` arguments of the build stage whose virtualenv the image copies."""
    (source,) = {rest.split()[0].removeprefix("--from=") for word, rest in image(target) if word == "COPY"}
    return [arguments for word, rest in image(source) if word == "RUN"
            for arguments in re.findall(r"pip install ([^&]+?)\s*(?:&&|$)", rest) if arguments != "--upgrade pip"]


def test_multi_stage_on_a_slim_python_base():
    args = dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)
    seen: set[str] = set()
    for stage in stages().values():
        if stage.base not in seen:
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stage.base)
            assert re.fullmatch(r"python:3\.1[1-9][.\d]*-slim(-\w+)?", base), base
        seen.add(stage.name)
    assert list(stages())[-1] == "router", "a plain `docker build .` builds the router image"


@pytest.mark.parametrize(("target", "command"), [("router", "serve"), ("operator", "operator")])
def test_each_image_is_non_root_without_build_tools_or_sources(target, command):
    final = image(target)
    words = [word for word, _ in final]
    user = [rest for word, rest in final if word == "USER"]
    assert user and user[-1] == f"{RUN_AS}:{RUN_AS}"  # the uid the operator's router pods and the chart run as
    for word, rest in final:
        if word == "RUN":
            assert not BUILD_TOOLS.search(rest), rest
            assert "pip install" not in rest, rest
        if word == "COPY":
            assert rest.startswith("--from=build-"), f"an image copies only a build stage's virtualenv: {rest}"
    assert words.index("USER") > max(i for i, w in enumerate(words) if w in ("RUN", "COPY"))
    assert dict(final)["ENTRYPOINT"] == '["rollout-router"]'
    assert dict(final)["CMD"].startswith(f'["{command}"')


@pytest.mark.parametrize(("target", "install"), [("router", "."), ("operator", "'.[operator]'")])
def test_each_image_installs_only_what_it_runs(target, install):
    """The router gets the core install, the operator the [operator] extra; neither the [sim] plotting stack."""
    assert installs(target) == [install]


def test_chart_and_operator_name_the_images_this_dockerfile_builds():
    values = yaml.safe_load((ROOT / "charts/rollout-router/values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts/rollout-router/Chart.yaml").read_text())
    assert DEFAULT_IMAGE == f"{values['routerImage']['repository']}:{chart['appVersion']}"
    assert f"docker build -t {DEFAULT_IMAGE} ." in DOCKERFILE.read_text()
    operator_image = f"{values['image']['repository']}:{chart['appVersion']}"
    assert f"docker build --target operator -t {operator_image} ." in DOCKERFILE.read_text()
    version = [rest for word, rest in instructions() if word == "ARG" and rest.startswith("VERSION=")]
    assert version == [f"VERSION={chart['appVersion']}"]


def context_files() -> list[Path]:
    """What `docker build .` sends, after .dockerignore."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(relative: str) -> bool:
        parts = relative.split("/")
        return any(fnmatch.fnmatch(relative, p.removeprefix("**/")) or fnmatch.fnmatch(parts[-1], p.removeprefix("**/"))
                   or any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts)))
                   or any(fnmatch.fnmatch(part, p.removeprefix("**/")) for part in parts[:-1])
                   for p in patterns)
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return [ROOT / f for f in tracked if not ignored(f) and (ROOT / f).is_file()]


def test_build_stage_copies_build_the_package_with_both_commands(tmp_path):
    """Replay the build stage's COPY lines on the .dockerignore'd context, then build a wheel from them."""
    sent = {path.relative_to(ROOT).as_posix() for path in context_files()}
    assert not any(s.startswith((".venv/", "tests/", ".git/")) for s in sent)
    build = tmp_path / "src"
    for word, rest in stages()["build"].body:
        if word != "COPY":
            continue
        *sources, _destination = rest.split()
        for source in sources:
            source = source.rstrip("/")
            matched = [s for s in sent if s == source or s.startswith(source + "/")]
            assert matched, f"COPY {source}: not in the build context"
            for relative in matched:
                (build / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / relative, build / relative)
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(wheels), str(build)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("rollout_router-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "rollout_router/cli.py" in names and "rollout_router/serve.py" in names
    assert "rollout_router_operator/cli.py" in names and "rollout_router_operator/handlers.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rollout-router = rollout_router.cli:main" in entry_points
