"""The CRD: generated from the models, committed in crds/, and the docs' examples valid against it."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rollout_router_operator.crd import crd_manifest, crd_yaml
from rollout_router_operator.render import InvalidSpec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "rolloutrouter.dev_rolloutrouters.yaml"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("rolloutrouter*.yaml"))


def as_json_schema(node):
    """A structural schema as draft-4 JSON Schema (OpenAPI 3.0's dialect), strict about unknown fields."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k not in ("nullable", "default", "description")}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable"):
        out["type"] = [*([out["type"]] if isinstance(out.get("type"), str) else out.get("type", [])), "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def validator() -> jsonschema.Draft4Validator:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(as_json_schema(schema))


def test_committed_crd_matches_the_models():
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ drifted from the models: run `rollout-router crd -o " \
                                              f"{CRD_FILE.relative_to(ROOT)}`"


def test_cli_prints_the_crd():
    script = Path(sys.executable).with_name("rollout-router")
    out = subprocess.run([str(script), "crd"], capture_output=True, text=True, check=True).stdout
    assert out == CRD_FILE.read_text()


def test_crd_shape():
    crd = crd_manifest()
    assert crd["spec"]["names"]["shortNames"] == ["rr"] and crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == ["Margin", "Backends", "Kept", "Broken", "Ready", "Age"]
    assert {c["name"]: c["jsonPath"] for c in columns if c.get("priority") == 1} == {  # kubectl get rr -o wide
        "Forwarded": ".status.fleet.forwarded", "Handoffs": ".status.fleet.handoffs",
        "Unreachable": ".status.fleet.ownerUnreachable", "Repin-Prefill": ".status.affinity.repinPrefillTokens",
        "TTFB-Moved/Kept": ".status.affinity.ttfbMovedVsKept"}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["selector"]
    assert spec["properties"]["backendPort"] == {"x-kubernetes-int-or-string": True, "default": 8000, "nullable": True,
                                                 "description": spec["properties"]["backendPort"]["description"]}
    assert spec["properties"]["session"]["properties"]["maxSessions"]["default"] == 100000
    assert spec["properties"]["router"]["properties"]["service"]["properties"]["type"]["enum"] == \
        ["ClusterIP", "NodePort", "LoadBalancer"]
    assert spec["properties"]["selector"]["x-kubernetes-validations"]

    def walk(node, path="spec"):
        """Structural: every node typed (or int-or-string / free-form), no $ref or anyOf left."""
        assert "$ref" not in node and "anyOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")
    walk(spec)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path):
    body = yaml.safe_load(path.read_text())
    errors = list(validator().iter_errors(body))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    parse_spec({**body, "metadata": {**body["metadata"], "namespace": "ns"}})  # and the operator agrees


BAD = [  # (change to the minimal example, the field the schema must name)
    (lambda s: s.pop("selector"), "spec"),
    (lambda s: s.update(affinityBreakMargin=-1), "spec.affinityBreakMargin"),
    (lambda s: s.update(affinityBreakMargin="3"), "spec.affinityBreakMargin"),
    (lambda s: s.update(fullDeterminism="yes"), "spec.fullDeterminism"),
    (lambda s: s.update(policy="random"), "spec.policy"),
    (lambda s: s.update(backendPort=[8000]), "spec.backendPort"),
    (lambda s: s.update(session={"maxSessions": 0}), "spec.session.maxSessions"),
    (lambda s: s.update(session={"idleTimeoutSeconds": 0}), "spec.session.idleTimeoutSeconds"),
    (lambda s: s.update(router={"replicas": -1}), "spec.router.replicas"),
    (lambda s: s.update(router={"sessionOwnership": "false"}), "spec.router.sessionOwnership"),
    (lambda s: s.update(router={"adminToken": 0}), "spec.router.adminToken"),
    (lambda s: s.update(router={"sessionOwner": "entry"}), "spec.router.sessionOwner"),
    (lambda s: s.update(router={"service": {"type": "ExternalName"}}), "spec.router.service.type"),
    (lambda s: s.update(router={"service": {"port": 70000}}), "spec.router.service.port"),
    (lambda s: s.update(router={"tolerations": [{"effect": "Sometimes"}]}), "spec.router.tolerations.0.effect"),
    (lambda s: s.update(router={"env": [{"value": "x"}]}), "spec.router.env.0"),
    (lambda s: s.update(selector={"matchExpressions": [{"key": "a", "operator": "Near"}]}),
     "spec.selector.matchExpressions.0.operator"),
    (lambda s: s.update(typo=1), "spec"),
]


@pytest.mark.parametrize("change, field", BAD, ids=[field for _, field in BAD])
def test_bad_resources_are_rejected_naming_the_field(change, field):
    body = yaml.safe_load((ROOT / "docs" / "examples" / "rolloutrouter.yaml").read_text())
    change(body["spec"])
    errors = list(validator().iter_errors(body))
    assert errors
    named = {".".join(str(p) for p in e.absolute_path) for e in errors}
    assert field in named, named


CEL_ONLY = [  # the schema's CEL rules, which jsonschema cannot run: the operator's own check mirrors each
    ({"selector": {}}, "selector must have matchLabels or matchExpressions"),
    ({"selector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}, "In and NotIn need values"),
    ({"selector": {"matchLabels": {"a": "b"}}, "networkPolicy": {"prometheus": {"namespaceSelector": {
        "matchExpressions": [{"key": "a", "operator": "NotIn"}]}}}}, "In and NotIn need values"),
    ({"selector": {"matchLabels": {"a": "b"}}, "router": {"tolerations": [{"operator": "Equal"}]}}, "without a key"),
    ({"selector": {"matchLabels": {"a": "b"}}, "router": {"env": [{"name": "A", "value": "1", "valueFrom": {}}]}},
     "not both"),
    ({"selector": {"matchLabels": {"a": "b"}}, "router": {"sessionOwnership": False, "sessionOwner": "Entry"}},
     "sessionOwner Entry needs sessionOwnership true"),
    ({"selector": {"matchLabels": {"a": "b"}}, "policy": "cost_affinity"}, "policy cost_affinity needs a number"),
    ({"selector": {"matchLabels": {"a": "b"}}, "backendPort": 70000}, "a port is a number from 1 to 65535"),
    ({"selector": {"matchLabels": {"a": "b"}}, "backendPort": 0}, "a port is a number from 1 to 65535"),
    ({"selector": {"matchLabels": {"a": "b"}}, "grpcPort": "Grpc_Port"}, "a port is a number from 1 to 65535"),
]


@pytest.mark.parametrize("spec, message", CEL_ONLY)
def test_cel_rules_are_in_the_schema_and_mirrored_by_the_operator(spec, message):
    assert message in yaml.safe_dump(crd_manifest(), width=10_000)
    with pytest.raises(InvalidSpec, match=message):
        parse_spec({"metadata": {"name": "x", "namespace": "ns"}, "spec": copy.deepcopy(spec)})
