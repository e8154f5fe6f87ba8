"""The CRD: generated from the models, committed in crds/, and the docs' examples valid against it."""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rollout_router_operator.celrules import rules_of, violations
from rollout_router_operator.crd import crd_manifest, crd_yaml
from rollout_router_operator.render import parse_spec
from rollout_router_operator.status import collect

from .cel_cases import CASES, Case, spec

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


def committed_rules() -> dict:
    """spec's schema as crds/ installs it: the CEL rules the API server runs."""
    return yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def refused_as_expected(schema: dict, case: Case) -> bool:
    """Whether ``schema``'s CEL refuses the case's bad spec by the one rule it names, and admits its good ones."""
    broken = violations(schema, spec(case.bad))
    return len(broken) == 1 and broken[0].startswith(case.refusal) and \
        not any(violations(schema, spec(good)) for good in case.good)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_operator_refuses_a_resource_that_breaks_a_rule(case):
    """The operator's path: the resource's Degraded condition names the field and the rule, as kubectl would;
    the near resources that keep the rule are valid specs."""
    resource = {"metadata": {"name": "rollouts", "namespace": "ns", "generation": 2}, "spec": spec(case.bad)}
    status = asyncio.run(collect(resource, {}, 2))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    field, rule = case.refusal.split(": ", 1)  # the router's own port check names the value: "spec.grpcPort: '9-0': a"
    assert degraded["message"].startswith(field + ": ") and rule in degraded["message"], degraded["message"]
    for good in case.good:
        parse_spec({**resource, "spec": spec(good)})


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_crds_own_cel_refuses_exactly_that(case):
    """The CEL of crds/ alone, as the operator evaluates it (no model validator in between): one rule broken,
    named as the API server names it, and none by the near resources."""
    schema = committed_rules()
    assert refused_as_expected(schema, case), [violations(schema, spec(change)) for change in [case.bad, *case.good]]


def naming(where: str, rule: dict) -> list[Case]:
    """The cases refused by ``rule`` (sitting at ``where``, e.g. ``spec.router.tolerations[]``)."""
    place = where + rule.get("fieldPath", "")
    return [case for case in CASES if re.sub(r"\[\d+\]", "[]", case.refusal.split(": ", 1)[0]) == place
            and rule["message"].startswith(case.refusal.split(": ", 1)[1])]


def test_every_cel_rule_in_the_crd_is_broken_by_a_case():
    """A rule added without a case fails: each rule, at each place it sits, has a case."""
    for where, rule in rules_of(committed_rules()):
        assert naming(where, rule), (where, rule["message"])


@pytest.mark.parametrize("wrong", ["true", "!({})"], ids=["refuses-nothing", "negated"])
def test_a_wrong_rule_fails_its_cases(wrong):
    """Each rule of the CRD in turn made wrong (refusing nothing, or the opposite): the cases written for it then
    fail, so a wrong rule cannot pass this file."""
    schema = committed_rules()
    for where, rule in rules_of(schema):
        right = rule["rule"]
        rule["rule"] = wrong.format(right)
        assert not any(refused_as_expected(schema, case) for case in naming(where, rule)), (where, right)
        rule["rule"] = right


@pytest.mark.parametrize("policy", ["affinity", "cost_affinity"])
@pytest.mark.parametrize("determinism", [False, True])
@pytest.mark.parametrize("margin", [None, 0, 2.5])
def test_a_crossfield_rule_refuses_the_same_settings_as_its_cel(policy, determinism, margin):
    """``crossfield``'s rules are read two ways, by the router's settings and as the CRD's CEL: both refuse the
    same settings, with the same message."""
    from rollout_router.crossfield import COST_AFFINITY_HAS_A_MARGIN
    from rollout_router.settings import PolicySettings

    written = {"policy": policy, "fullDeterminism": determinism, "affinityBreakMargin": margin}
    schema = {"properties": {"policy": {}, "fullDeterminism": {}, "affinityBreakMargin": {"nullable": True}},
              "x-kubernetes-validations": [COST_AFFINITY_HAS_A_MARGIN.cel()]}
    by_cel = violations(schema, written)
    try:
        PolicySettings.model_validate(written)
        by_settings = []
    except ValueError as error:
        by_settings = [f"spec.{error.errors()[0]['msg'].removeprefix('Value error, ')}"]
    assert by_cel == by_settings
    assert bool(by_cel) == (policy == "cost_affinity" and not determinism and margin is None)


PORTS = [1, 65535, 0, 65536, -1, "0", "1", "65535", "65536", "00080", "8" * 16, "http", "g", "grpc-port", "a--b",
         "9-0", "grpc-", "-grpc", "grpc_port", "Grpc", "a12345678901234", "a123456789012345", "ｇｒｐｃ", "٨٠", ""]


@pytest.mark.parametrize("port", PORTS, ids=repr)
def test_the_port_rule_refuses_the_same_ports_as_its_cel(port):
    """``portrule.PORT`` is read two ways, by the router's settings and as the CRD's CEL on an int-or-string
    field: both take the same ports and refuse the others with the same message."""
    from rollout_router.portrule import PORT
    from rollout_router.settings import DiscoverySettings

    schema = {"properties": {"grpcPort": {"x-kubernetes-int-or-string": True}},
              "x-kubernetes-validations": [PORT.cel("grpcPort")]}
    by_cel = [refusal.split(": ")[-1] for refusal in violations(schema, {"grpcPort": port})]
    try:
        DiscoverySettings.model_validate({"selector": {"matchLabels": {"app": "vllm"}}, "grpcPort": port})
        by_settings = []
    except ValueError as error:
        by_settings = [error.errors()[0]["msg"].split(": ")[-1]]
    assert by_cel == by_settings
    assert by_settings == ([] if port in (1, 65535, "1", "65535", "00080", "http", "g", "grpc-port", "a12345678901234")
                           else [PORT.message])


SELECTORS = [{}, {"matchLabels": {"app": "vllm"}}, {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
             *({"matchExpressions": [{"key": "app", "operator": operator, **values}]}
               for operator in ("In", "NotIn", "Exists", "DoesNotExist") for values in ({}, {"values": ["vllm"]}))]


@pytest.mark.parametrize("selector", SELECTORS, ids=repr)
def test_a_selector_rule_refuses_the_same_selectors_as_its_cel(selector):
    """``crossfield``'s selector rules are read two ways, by the router's discovery settings and as the CRD's CEL
    on spec.selector: both refuse the same selectors, with the same message."""
    from rollout_router.settings import DiscoverySettings

    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    by_cel = [refusal.split(": ")[-1] for refusal in violations(schema, spec({"selector": selector}))]
    try:
        DiscoverySettings.model_validate({"selector": selector})
        by_settings = []
    except ValueError as error:
        by_settings = [error.errors()[0]["msg"].removeprefix("Value error, ").split(": ")[-1]]
    assert by_cel == by_settings
    bad = not selector or any((term["operator"] in ("In", "NotIn")) != bool(term.get("values"))
                              for term in selector.get("matchExpressions", ()))
    assert bool(by_settings) == bad
