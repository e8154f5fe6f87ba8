"""Status counters that never go backwards: what router pods counted stays counted after they go.

Each router pod counts from its own start, and the status shows sums over the
pods. Summed over the pods that answer now, those sums would drop whenever a
pod is replaced (every rolling update), its container restarts, or it is slow
to answer one poll. So the status keeps a ledger (``status.ledger``, pure here):
each listed pod's last report, and what the pods no longer counting have
counted (``retired``). The sums are the retired counts plus each listed pod's
last report:

- a pod that did not answer this poll (or is not Ready) counts with its last report;
- a pod whose router started again (its /status ``started_at`` changed, or a
  counter went down: how Prometheus reads a counter reset) retires its last
  report, and its new one counts from zero;
- a pod no longer listed retires its last report.

Counts are kept flat, one dotted name per counter (``fleet.forwarded``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Counts = dict[str, float]


def flat(report: Mapping, paths: Iterable[str]) -> Counts:
    """The counters of one parsed /status report (``status.parse_report``) at ``paths``; absent ones are 0."""
    counts: Counts = {}
    for path in paths:
        value: object = report
        for part in path.split("."):
            value = value.get(part, 0) if isinstance(value, Mapping) else 0
        counts[path] = value if isinstance(value, int | float) and not isinstance(value, bool) else 0
    return counts


def entry(started: float | None, counts: Counts) -> dict[str, Any]:
    """One pod's report as the ledger keeps it: when its router started, and its counts."""
    return {"started": started, "counts": counts}


def carry(previous: Mapping, listed: Iterable[str], reports: Mapping[str, dict[str, Any]]) -> dict:
    """The new ledger from the ``previous`` one (``{}`` at first), the router pods that exist now and the
    ``entry`` of each that answered: ``{"retired": Counts, "pods": [{"pod", "started", "counts"}]}``.

    Pods are a list, so the status's merge patch replaces it whole: a pod gone is gone from it.
    """
    retired = _counts(previous.get("retired"))
    last = {item["pod"]: entry(_started(item.get("started")), _counts(item.get("counts")))
            for item in previous.get("pods") or [] if isinstance(item, Mapping) and isinstance(item.get("pod"), str)}
    kept: dict[str, dict[str, Any]] = {}
    for pod in listed:
        before, now = last.pop(pod, None), reports.get(pod)
        if before is not None and now is not None and _restarted(before, now):
            _add(retired, before["counts"])  # what it counted before stays counted
        kept[pod] = now if now is not None else before if before is not None else entry(None, {})
    for gone in last.values():
        _add(retired, gone["counts"])
    return {"retired": retired, "pods": [{"pod": pod, **kept[pod]} for pod in sorted(kept)]}


def totals(ledger: Mapping, paths: Iterable[str]) -> Counts:
    """Each counter's sum: the retired counts and every listed pod's last report."""
    summed = {path: ledger["retired"].get(path, 0) for path in paths}
    for item in ledger["pods"]:
        _add(summed, {path: value for path, value in item["counts"].items() if path in summed})
    return summed


def _restarted(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    if before["started"] is not None and now["started"] is not None:
        return bool(before["started"] != now["started"])
    return any(now["counts"].get(path, 0) < value for path, value in before["counts"].items())


def _started(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _counts(value: object) -> Counts:
    """A stored Counts, with anything that is not a number (a hand-edited status) dropped."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, int | float)
            and not isinstance(v, bool) and v >= 0}


def _add(into: Counts, counts: Mapping[str, float]) -> None:
    for path, value in counts.items():
        into[path] = into.get(path, 0) + value
