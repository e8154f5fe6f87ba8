"""The chart's side of many router pods: the admin token key the operator derives router tokens from,
the admission policy's rule for the token Secrets, and sessionOwnership on the example RolloutRouter
(on tests/test_chart.py's helpers)."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest

from rollout_router_operator import cli
from rollout_router_operator.render import render as render_children
from tests.test_chart import NAMESPACE, chart, of_kind, one, render, validate_rolloutrouter  # noqa: F401
from tests.test_chart_operator import operator_args, operator_container


def key_file(manifests: list[dict]) -> tuple[str, str]:
    """(Secret name, key) the operator's --admin-token-key-file is projected from."""
    deployment = one(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    path = operator_args(operator_container(manifests)).admin_token_key_file
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if path.parent == Path(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == path.name]
    return volume["secret"]["secretName"], item["key"]


def test_the_chart_draws_a_key_and_hands_it_to_the_operator(chart, tmp_path):
    manifests = render(chart, {})
    name, key = key_file(manifests)
    (secret,) = [s for s in of_kind(manifests, "Secret") if s["metadata"]["name"] == name]
    assert secret["metadata"]["namespace"] == NAMESPACE and secret["type"] == "Opaque"
    raw = base64.b64decode(secret["data"][key])
    (tmp_path / "key").write_bytes(raw)
    assert cli.token_key(tmp_path / "key") == raw  # the operator accepts it as it is
    assert raw != base64.b64decode(one(render(chart, {}), "Secret")["data"]["key"])  # drawn, not a constant


def test_an_existing_key_secret_replaces_the_charts(chart):
    manifests = render(chart, {"adminTokenKey": {"existingSecret": "my-key"}})
    assert of_kind(manifests, "Secret") == []
    assert key_file(manifests) == ("my-key", "key")
    with pytest.raises(Exception, match="existingSecret"):
        render(chart, {"adminTokenKey": {"existingSecret": "Not A Name"}})


@pytest.mark.parametrize("content, problem", [(None, "No such file"), (b"short\n", "at least 16 bytes")])
def test_the_operator_refuses_a_missing_or_weak_key(tmp_path, content, problem):
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises((OSError, ValueError), match=problem):
        cli.token_key(path)
    assert len(cli.token_key(None)) == 32  # no file given: a random key for this process


def test_the_admission_policy_admits_only_admin_token_secrets(chart):
    policy = one(render(chart, {}), "ValidatingAdmissionPolicy")
    covered = {resource for rule in policy["spec"]["matchConstraints"]["resourceRules"] for resource in rule["resources"]}
    assert "secrets" in covered
    rule = next(v["expression"] for v in policy["spec"]["validations"] if "'secrets'" in v["expression"])
    secret = next(c for c in render_children(example(), token_key=b"k" * 32) if c["kind"] == "Secret")
    suffix = rule.split("endsWith('", 1)[1].split("'", 1)[0]
    assert secret["metadata"]["name"].endswith(suffix) and secret["type"] == "Opaque" and list(secret["data"]) == ["token"]
    assert "object.data.size() == 1" in rule and "'token' in object.data" in rule


def example(spec: dict | None = None) -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
            "metadata": {"name": "rollouts", "namespace": "team-a", "uid": "uid-1"},
            "spec": spec or {"selector": {"matchLabels": {"app": "vllm"}}}}


@pytest.mark.parametrize("owned", [True, False])
def test_the_example_rolloutrouter_sets_session_ownership(chart, owned):
    values = {"example": {"enabled": True, "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                                                    "router": {"sessionOwnership": owned}}}}
    resource = one(render(chart, values), "RolloutRouter")
    validate_rolloutrouter(resource)
    children = render_children({**resource, "metadata": {**resource["metadata"], "uid": "u"}})
    command = one(children, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ("--peer-selector" in command) is owned
    assert ("sessionAffinity" in one(children, "Service")["spec"]) is not owned


def test_the_example_rolloutrouter_may_name_its_session_owner(chart):
    values = {"example": {"enabled": True, "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                                                    "router": {"sessionOwner": "Entry"}}}}
    resource = one(render(chart, values), "RolloutRouter")
    validate_rolloutrouter(resource)
    children = render_children({**resource, "metadata": {**resource["metadata"], "uid": "u"}})
    command = one(children, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--ownership") + 1] == "entry"
    with pytest.raises(Exception, match="sessionOwner"):
        render(chart, {"example": {"enabled": True, "spec": {"selector": {}, "router": {"sessionOwner": "entry"}}}})


def test_the_default_example_spells_out_ownership_and_the_token(chart):
    resource = one(render(chart, {"example": {"enabled": True}}), "RolloutRouter")
    assert resource["spec"]["router"] == {"sessionOwnership": True, "adminToken": True}
    with pytest.raises(Exception, match="sessionOwnership"):
        render(chart, {"example": {"enabled": True, "spec": {"selector": {}, "router": {"sessionOwnership": "yes"}}}})
