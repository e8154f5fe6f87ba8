"""docs/helm.md's "Lint and render without helm": run as written, its output is multi-document YAML holding the
objects ``helm template`` prints for the same values.

The Helm SDK renders each template file on its own; the page's loop joins them. The comparison with the ``helm``
binary (built by tests/realk8s/build.sh, or one on PATH) is what says the join is right; without one it is skipped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_readme import blocks

ROOT = Path(__file__).resolve().parent.parent
HELM_PAGE = ROOT / "docs/helm.md"
SECTION = "Lint and render without `helm`"
TOKEN_KEY = ("Secret", "rollout-router-operator-token-key")  # drawn at random on every render


def offline_render() -> subprocess.CompletedProcess:
    (snippet,) = [body for lang, body in blocks(HELM_PAGE.read_text(), SECTION) if lang == "python"]
    return subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120, cwd=ROOT)


def objects(text: str) -> list[dict]:
    """The YAML stream's objects, the random token key replaced by its length (both renders draw their own)."""
    found = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    for doc in found:
        if (doc["kind"], doc["metadata"]["name"]) == TOKEN_KEY:
            doc["data"]["key"] = f"<{len(doc['data']['key'])} characters>"
    return sorted(found, key=lambda doc: (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]))


def helm_binary() -> str | None:
    """The tier's helm (``REALK8S_BIN``, else build.sh's cache), else one on PATH."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-router"
    candidates = [Path(os.environ.get("REALK8S_BIN") or "/nonexistent") / "helm", *sorted(cache.glob("k8s-*/bin/helm"))]
    found = [str(path) for path in candidates if path.is_file()]
    return found[0] if found else shutil.which("helm")


@pytest.fixture(scope="module")
def rendered() -> subprocess.CompletedProcess:
    done = offline_render()
    assert done.returncode == 0, done.stderr
    return done


def test_the_offline_render_lints_on_stderr_and_prints_yaml_on_stdout(rendered):
    assert rendered.stderr == "1 chart linted, 0 errors\n"
    assert rendered.stdout.startswith("---\n# Source: rollout-router/templates/")
    kinds = [doc["kind"] for doc in objects(rendered.stdout)]
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service"} <= set(kinds)
    assert len(kinds) == rendered.stdout.count("\n---\n") + 1  # one object a document, nothing but objects


def test_the_offline_render_gives_the_objects_helm_template_gives(rendered):
    helm = helm_binary()
    if helm is None:
        pytest.skip("no helm binary (make test-k8s builds one into ~/.cache/rollout-router; or put helm on PATH)")
    template = subprocess.run(
        [helm, "template", "rollout-router", "charts/rollout-router", "-n", "rollout-router-system",
         "--set", "operator.watchAllNamespaces=true", "--kube-version", "v1.34.4"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert template.returncode == 0, template.stderr
    assert objects(rendered.stdout) == objects(template.stdout)
