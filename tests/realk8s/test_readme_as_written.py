"""The README's "On Kubernetes" block, run line by line as written, on a cluster without the Helm release.

The block is read from README.md when the test runs, so an edit to the README is what runs. bash runs it from the
checkout (``set -euo pipefail``), with the tier's kubectl first on PATH and the virtualenv's ``rollout-router``;
``make image`` builds (or finds current) the two images. One line is the tier's own: the one that loads the images
into kind or minikube or pushes them, for this node agent runs containers from podman's local store; in its place the
script checks both images are there (with the processes fallback, where no image runs, that line and ``make image``
are skipped). ``kubectl`` works in the test's namespace (its kubeconfig's current namespace, as a user's would),
where a vLLM Deployment's pods labelled app=vllm are Ready.

The block installs the operator from docs/examples/operator.yaml, into the namespace and ClusterRole names the
session's Helm release uses too; so this test is marked ``before_helm``, which conftest's collection hook runs
first, and it deletes all it applied (the resource, the operator and its namespace, the CRD), waiting until each
is gone, before the Helm release is installed.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_router.advice import MARGIN
from tests.test_readme import README, blocks

from .cluster import Cluster, eventually
from .runtime import CONTAINERS_CONF, PODMAN, PROJECT_IMAGES, Runtime
from .workloads import chat, router_status, routers_serving, rr_table, vllm_fleet

pytestmark = [pytest.mark.realk8s, pytest.mark.before_helm, pytest.mark.timeout(900)]

LOAD_LINE = re.compile(r"^(kind load|minikube image load|(docker|podman) push)\b")
OPERATOR_NAMESPACE = "rollout-router-system"  # docs/examples/operator.yaml's, and the Helm fixture's
OPERATOR_SELECTOR = "app.kubernetes.io/name=rollout-router-operator"
CRD = "rolloutrouters.rolloutrouter.dev"


def readme_script(runtime: Runtime) -> str:
    """The README's block for bash, its image-loading line (there must be exactly one) replaced by the tier's own."""
    (block, *_) = [body for lang, body in blocks(README.read_text(), "On Kubernetes") if lang == "sh"]
    lines = block.splitlines()
    loads = [index for index, line in enumerate(lines) if LOAD_LINE.match(line)]
    assert len(loads) == 1, f"the README's block should load the images into the cluster in one line: {block}"
    images = " && ".join(f"CONTAINERS_CONF={CONTAINERS_CONF} {shlex.join(PODMAN)} image exists {image}"
                         for image in PROJECT_IMAGES)
    lines[loads[0]] = images if runtime.name == "podman" else ": no images with the processes fallback"
    if runtime.name != "podman":
        lines = [": make image skipped (processes fallback)" if line.startswith("make image") else line
                 for line in lines]
    return "\n".join(["set -euo pipefail -x", *lines, ""])


@pytest.fixture
def users_kubeconfig(cluster: Cluster, namespace: str, tmp_path: Path) -> Path:
    """The cluster admin's kubeconfig with the test's namespace as its current one."""
    path = tmp_path / "kubeconfig"
    path.write_text(cluster.kubectl("config", "view", "--raw").stdout)
    cluster.kubectl("config", "set-context", "--current", f"--namespace={namespace}", f"--kubeconfig={path}")
    return path


@pytest.fixture
def clean_cluster(cluster: Cluster, namespace: str) -> Iterator[None]:
    """No operator yet (the Helm release comes later); afterwards nothing of the README's is left."""
    assert cluster.kubectl("get", "namespace", OPERATOR_NAMESPACE, check=False).returncode != 0, (
        f"{OPERATOR_NAMESPACE} exists: this test must run before the Helm release (conftest orders it first)")
    yield
    remove_what_the_readme_applied(cluster, namespace)


def remove_what_the_readme_applied(cluster: Cluster, namespace: str) -> None:
    """The resource first, while its operator still runs to take its finalizer off; then the operator, its
    namespace and the CRD, each waited for."""
    if cluster.kubectl("delete", "rr", "rollouts", "-n", namespace, "--ignore-not-found", "--timeout=120s",
                       check=False).returncode != 0:  # no operator came up to finalize it
        cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)
    cluster.kubectl("delete", "-f", "docs/examples/operator.yaml", "--ignore-not-found", "--timeout=180s")
    cluster.kubectl("delete", "crd", CRD, "--ignore-not-found", "--timeout=120s")
    eventually(lambda: all(cluster.kubectl("get", *what, check=False).returncode != 0 for what in (
        ("namespace", OPERATOR_NAMESPACE), ("clusterrole", "rollout-router-operator"), ("crd", CRD))),
        120, "the README's operator, its namespace and the CRD are gone")


def test_the_readme_kubernetes_block_runs_as_written(cluster, runtime, namespace, users_kubeconfig, clean_cluster):
    vllm_fleet(cluster, namespace, 3)
    env = {**cluster.env(), "KUBECONFIG": str(users_kubeconfig),
           "PATH": f"{cluster.bin_dir}:{Path(sys.executable).parent}:{cluster.env()['PATH']}"}
    done = subprocess.run(["bash", "-c", readme_script(runtime)], capture_output=True, text=True, env=env,
                          cwd=cluster.root, timeout=800)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    for line in ("customresourcedefinition.apiextensions.k8s.io/rolloutrouters.rolloutrouter.dev created",
                 f"namespace/{OPERATOR_NAMESPACE} created", "deployment.apps/rollout-router-operator created",
                 "rolloutrouter.rolloutrouter.dev/rollouts created"):
        assert line in done.stdout.splitlines(), line
    assert re.search(rf"^NAME +MARGIN .*\nrollouts +{MARGIN} ", done.stdout, re.M), done.stdout  # kubectl get rr

    [operator] = cluster.wait_ready_pods(OPERATOR_NAMESPACE, OPERATOR_SELECTOR, 1, timeout=180)
    [router] = routers_serving(cluster, namespace, 3)
    if runtime.name == "podman":  # the pods run the images make image built
        images = {pod["spec"]["containers"][0]["image"] for pod in (router, operator)}
        assert images == set(PROJECT_IMAGES)
    assert all(len(set(chat(router, f"conversation-{i}", turns=4))) == 1 for i in range(6))
    assert router_status(router)["affinity_kept"] == 18
    table = eventually(lambda: (lambda t: t if t.get("KEPT") == "18" else None)(rr_table(cluster, namespace)),
                       90, "kubectl get rr shows the router's kept turns")  # the README's operator polls every 10 s
    print("\n" + cluster.kubectl("get", "rr", "-n", namespace).stdout)
    assert (table["MARGIN"], table["BACKENDS"], table["BROKEN"], table["READY"]) == (str(MARGIN), "3/3", "0", "1/1")


def test_docs_kubernetes_md_gives_the_same_steps():
    """The Kubernetes page opens with the README's block, so what runs above is what both pages say."""
    page = (Path(__file__).resolve().parents[2] / "docs/kubernetes.md").read_text()
    (ours, *_) = [body for lang, body in blocks(README.read_text(), "On Kubernetes") if lang == "sh"]
    first = re.search(r"```sh\n(.*?)```", page, re.S)
    assert first and first[1] == ours
