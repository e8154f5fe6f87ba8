"""``rollout-router render FILE``: what the operator would create for a resource, printed offline as YAML.

Run as a user runs it (the installed console script, no cluster, no credentials); the output is parsed back and
compared with what the operator's handler renders for the same resource, image and key.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollout_router_operator.render import render
from rollout_router_operator.spec import DEFAULT_IMAGE
from tests.test_packaging import without_extras  # noqa: F401  (a fixture: the core install, every extra hidden)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(Path(sys.executable).with_name("rollout-router"))
EXAMPLE = ROOT / "docs/examples/rolloutrouter.yaml"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """No KUBECONFIG, no ~/.kube/config, not in a pod: offline; PYTHONPATH kept (``without_extras`` sets it)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return subprocess.run([SCRIPT, "render", *args], capture_output=True, text=True, timeout=60, input=stdin, env=env)


def rendered(*args: str, stdin: str | None = None) -> tuple[list[str], list[dict]]:
    """The output's leading comments and its documents; it must succeed with nothing on stderr."""
    done = run(*args, stdin=stdin)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    comments = [line for line in done.stdout.splitlines() if line.startswith("#")]
    return comments, [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def test_the_example_renders_every_child_in_its_namespace():
    comments, children = rendered(str(EXAMPLE), "--namespace", "team-a")
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ServiceAccount", "rollouts-router"), ("Role", "rollouts-router"), ("RoleBinding", "rollouts-router"),
        ("Secret", "rollouts-router-admin-token"), ("ConfigMap", "rollouts-router-config"),
        ("Deployment", "rollouts-router"), ("Service", "rollouts-router")]
    assert {c["metadata"]["namespace"] for c in children} == {"team-a"}
    config = yaml.safe_load(children[4]["data"]["config.yaml"])
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert config["affinityBreakMargin"] == example["affinityBreakMargin"]
    assert config["discovery"]["namespace"] == "team-a"
    assert config["discovery"]["selector"]["matchLabels"] == example["selector"]["matchLabels"]
    (container,) = children[5]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == DEFAULT_IMAGE
    assert comments == [
        "# RolloutRouter team-a/rollouts: what the operator creates (rollout-router render)",
        "# ownerReferences[0].uid: a placeholder (the API server assigns the resource's uid)",
        "# the admin token Secret: a placeholder (--admin-token-key-file gives the operator's key)"]


def test_a_resource_read_back_with_the_operators_key_renders_exactly_what_the_operator_applies(tmp_path):
    """``kubectl get rr -o yaml`` carries the uid; with the key, nothing is a placeholder."""
    resource = yaml.safe_load(EXAMPLE.read_text())
    resource["metadata"].update(namespace="team-b", uid="6f1c1a9e-0d5e-4c1b-9a57-2b1f0c3d4e5f")
    (tmp_path / "rr.yaml").write_text(yaml.safe_dump(resource))
    (tmp_path / "key").write_bytes(b"k" * 32)
    comments, children = rendered(str(tmp_path / "rr.yaml"), "--admin-token-key-file", str(tmp_path / "key"),
                                  "--router-image", "registry.example.com/rollout-router:0.1.0")
    assert children == render(resource, "registry.example.com/rollout-router:0.1.0", token_key=b"k" * 32)
    assert comments == ["# RolloutRouter team-b/rollouts: what the operator creates (rollout-router render)"]


def test_a_list_from_stdin_renders_each_resource_after_the_other():
    example = yaml.safe_load(EXAMPLE.read_text())
    second = {**example, "metadata": {"name": "evals"}, "spec": {**example["spec"], "router": {"replicas": 2}}}
    _, children = rendered("-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [example, second]}))
    assert [c["metadata"]["labels"]["app.kubernetes.io/instance"] for c in children] == ["rollouts"] * 7 + ["evals"] * 8
    assert children[-1]["kind"] == "PodDisruptionBudget" and {c["metadata"]["namespace"] for c in children} == {"default"}


def test_render_on_the_core_install_names_the_operator_extra(without_extras):
    """render checks a spec as the operator does, the CRD's CEL rules included (the [operator] extra's CEL
    library): on the core install it says so in one line instead of printing what it could not check."""
    done = run(str(EXAMPLE))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("rollout-router render: needs the [operator] extra ("), done.stderr


RESOURCE = EXAMPLE.read_text()


@pytest.mark.parametrize(("args", "stdin", "says"), [
    (["/nonexistent/rr.yaml"], None, "/nonexistent/rr.yaml: No such file or directory"),
    (["-"], "spec: [1\n", "stdin: not YAML: line 2, column 1: expected ',' or ']', but got '<stream end>'"),
    (["-"], "apiVersion: v1\nkind: Pod\n", "stdin: document 1 is a Pod (v1), not a RolloutRouter "
                                           "(rolloutrouter.dev/v1alpha1)"),
    (["-"], RESOURCE + "---\n- a\n", "stdin: document 2 is a list, not a RolloutRouter"),
    (["-"], "", "stdin: no RolloutRouter in it"),
    (["-"], RESOURCE.replace("affinityBreakMargin: 8", "affinityBreakMargin: -1"),
     "stdin: RolloutRouter rollouts: spec.affinityBreakMargin: Input should be greater than or equal to 0"),
    (["-"], RESOURCE.replace("  name: rollouts\n", ""), "stdin: a RolloutRouter without metadata.name"),
    (["-", "-n", "b"], RESOURCE.replace("  name: rollouts\n", "  name: rollouts\n  namespace: a\n"),
     "stdin: RolloutRouter rollouts is in namespace a, not --namespace b"),
    (["-", "--admin-token-key-file", "/nonexistent/key"], RESOURCE, "--admin-token-key-file /nonexistent/key: No such"),
    ([], None, "the following arguments are required: FILE (see 'rollout-router render --help')"),
])
def test_a_mistake_is_one_line_naming_it_and_exit_2(args, stdin, says):
    done = run(*args, stdin=stdin)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("rollout-router render: ") and says in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
