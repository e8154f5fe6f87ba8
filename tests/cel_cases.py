"""Every CEL rule of the CRD, broken and kept: the cases the quick tier (tests/test_crd.py: the operator and the
CRD's CEL as it evaluates it) and the real-cluster tier (tests/realk8s/test_validation.py: the API server) run.

A case is a change to a minimal spec that breaks one rule, how the rule is named when it refuses it (the field as
the API server names it, then the rule's message), and near changes that keep to the rule, on the other side of
each of its conditions: a rule that refuses too little fails the first, one that refuses too much the others.
test_crd.py checks that every rule, at every place it sits, has a case.
"""
from __future__ import annotations

import copy
from typing import NamedTuple

MINIMAL = {"selector": {"matchLabels": {"app": "vllm"}}}
PEER = "a peer sets podSelector and/or namespaceSelector, or ipBlock alone"
VALUES = "In and NotIn need values; Exists and DoesNotExist take none"
PORT = "a port is a number from 1 to 65535"
TIMEOUT = "scrapeTimeout must be at most the interval"


class Case(NamedTuple):
    name: str
    bad: dict
    refusal: str
    good: list[dict]


def spec(change: dict) -> dict:
    """The minimal spec with ``change`` (a None value: the field written as null)."""
    return MINIMAL | copy.deepcopy(change)


def _peer(where: str, fields: dict) -> dict:
    """spec.networkPolicy with one peer at ``where``: prometheus is one peer, clients and admin are lists."""
    return {"networkPolicy": {where: fields if where == "prometheus" else [fields]}}


def _at(where: str) -> str:
    return f"spec.networkPolicy.{where}" + ("" if where == "prometheus" else "[0]")


def _requirement(operator: str, values: list[str] | None = None) -> dict:
    return {"key": "role", "operator": operator, **({"values": values} if values is not None else {})}


PEERS = ("clients", "prometheus", "admin")
SELECTORS = ("podSelector", "namespaceSelector")

CASES = [
    Case("empty-selector", {"selector": {}}, "spec.selector: selector must have matchLabels or matchExpressions",
         [{"selector": {"matchExpressions": [_requirement("Exists")]}}, {"selector": {"matchLabels": {"a": "b"}}}]),
    Case("in-without-values", {"selector": {"matchExpressions": [_requirement("In")]}},
         f"spec.selector.matchExpressions[0]: {VALUES}",
         [{"selector": {"matchExpressions": [_requirement("In", ["a"]), _requirement("NotIn", ["b"])]}}]),
    Case("exists-with-values", {"selector": {"matchLabels": {"app": "vllm"}, "matchExpressions": [
         _requirement("Exists"), _requirement("DoesNotExist", ["a"])]}},
         f"spec.selector.matchExpressions[1]: {VALUES}",
         [{"selector": {"matchExpressions": [_requirement("Exists"), _requirement("DoesNotExist", [])]}}]),
    *[Case(f"{where}-{selector}-notin-without-values", _peer(where, {selector: {"matchExpressions": [
        _requirement("NotIn")]}}), f"{_at(where)}.{selector}.matchExpressions[0]: {VALUES}",
        [_peer(where, {selector: {"matchExpressions": [_requirement("NotIn", ["batch"])]}})])
      for where in PEERS for selector in SELECTORS],
    *[Case(f"{where}-ip-block-and-selector", _peer(where, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}),
           f"{_at(where)}: {PEER}",
           [_peer(where, {"ipBlock": {"cidr": "10.0.0.0/8"}}), _peer(where, {"podSelector": {}}),
            _peer(where, {"namespaceSelector": {}}), _peer(where, {"podSelector": {}, "namespaceSelector": {}})])
      for where in PEERS],
    *[Case(f"{where}-peer-of-nothing", _peer(where, {}), f"{_at(where)}: {PEER}", [])
      for where in PEERS],
    Case("toleration-without-key", {"router": {"tolerations": [{"key": "gpu"}, {"operator": "Equal"}]}},
         "spec.router.tolerations[1]: a toleration without a key must use operator Exists",
         [{"router": {"tolerations": [{"key": "gpu", "effect": "NoSchedule"}, {"operator": "Exists"}]}}]),
    Case("exists-toleration-with-value", {"router": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": ""}]}},
         "spec.router.tolerations[0]: operator Exists takes no value",
         [{"router": {"tolerations": [{"key": "gpu", "value": "a100"}, {"key": "gpu", "operator": "Exists"}]}}]),
    Case("env-value-and-value-from", {"router": {"env": [{"name": "A", "value": "1"}, {
         "name": "B", "value": "", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}},
         "spec.router.env[1]: set value or valueFrom, not both",
         [{"router": {"env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": {
             "name": "s", "key": "k"}}}, {"name": "C"}]}}]),
    Case("entry-without-ownership", {"router": {"sessionOwnership": False, "sessionOwner": "Entry"}},
         "spec.router.sessionOwner: sessionOwner Entry needs sessionOwnership true",
         [{"router": {"sessionOwner": "Entry"}}, {"router": {"sessionOwnership": False}}]),
    Case("scrape-timeout-over-interval", {"serviceMonitor": {"interval": "1m", "scrapeTimeout": "1m1ms"}},
         f"spec.serviceMonitor.scrapeTimeout: {TIMEOUT}",
         [{"serviceMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "59s1000ms"}},
          {"serviceMonitor": {"interval": "1h", "scrapeTimeout": "59m"}}]),
    Case("default-timeout-over-interval", {"serviceMonitor": {"enabled": True, "interval": "9s"}},
         f"spec.serviceMonitor.scrapeTimeout: {TIMEOUT}", [{"serviceMonitor": {"interval": "10s"}}]),
    Case("cost-affinity-without-margin", {"policy": "cost_affinity", "affinityBreakMargin": None},
         "spec.affinityBreakMargin: policy cost_affinity needs a number (e.g. 2)",
         [{"policy": "cost_affinity", "fullDeterminism": True}, {"policy": "cost_affinity", "affinityBreakMargin": 0},
          {"policy": "least_loaded"}]),
    Case("backend-port-over-range", {"backendPort": 65536}, f"spec.backendPort: {PORT}",
         [{"backendPort": 65535}, {"backendPort": 1}, {"backendPort": None, "grpcPort": 9000}]),
    Case("backend-port-zero", {"backendPort": 0}, f"spec.backendPort: {PORT}", []),
    Case("backend-port-digits-zero", {"backendPort": "0"}, f"spec.backendPort: {PORT}",
         [{"backendPort": "1"}, {"backendPort": "65535"}]),
    Case("backend-port-digits-over-range", {"backendPort": "65536"}, f"spec.backendPort: {PORT}", []),
    Case("grpc-port-name-with-underscore", {"grpcPort": "grpc_port"}, f"spec.grpcPort: {PORT}",
         [{"grpcPort": "grpc-port"}, {"grpcPort": "g"}, {"grpcPort": "a12345678901234"}]),
    Case("grpc-port-name-without-letter", {"grpcPort": "9-0"}, f"spec.grpcPort: {PORT}", [{"grpcPort": "g9-0"}]),
    Case("grpc-port-name-with-double-dash", {"grpcPort": "a--b"}, f"spec.grpcPort: {PORT}", [{"grpcPort": "a-b"}]),
    Case("grpc-port-name-too-long", {"grpcPort": "a123456789012345"}, f"spec.grpcPort: {PORT}", []),
    Case("grpc-port-name-ending-in-dash", {"grpcPort": "grpc-"}, f"spec.grpcPort: {PORT}", []),
    Case("grpc-port-out-of-range", {"grpcPort": -1}, f"spec.grpcPort: {PORT}", [{"grpcPort": 65535}]),
]
