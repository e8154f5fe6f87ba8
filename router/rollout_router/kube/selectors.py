"""Kubernetes label selectors: the query-string form and a local matcher.

The operator uses the matcher to reject selectors that would catch the
router's own pods; discovery uses it to double-check what the API returned.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..settings import LabelSelector


def labels_query(labels: Mapping[str, str]) -> str:
    """Equality terms only, e.g. ``app=vllm,pool=a``: the query for a set of labels."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def to_query(selector: LabelSelector) -> str:
    """The ``labelSelector`` query parameter, e.g. ``app=vllm,tier in (a,b),!legacy``."""
    parts = [labels_query(selector.match_labels)] if selector.match_labels else []
    for expr in selector.match_expressions:
        values = ",".join(expr.values)
        parts.append({
            "In": f"{expr.key} in ({values})",
            "NotIn": f"{expr.key} notin ({values})",
            "Exists": expr.key,
            "DoesNotExist": f"!{expr.key}",
        }[expr.operator])
    return ",".join(parts)


def matches(selector: LabelSelector, labels: Mapping[str, str] | None) -> bool:
    """Whether ``labels`` satisfy every term; an empty selector matches everything."""
    labels = labels or {}
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for expr in selector.match_expressions:
        present = expr.key in labels
        ok = {
            "In": present and labels[expr.key] in expr.values,
            "NotIn": not present or labels[expr.key] not in expr.values,
            "Exists": present,
            "DoesNotExist": not present,
        }[expr.operator]
        if not ok:
            return False
    return True
