"""Issue 13 part 3's criterion, read from a grid run: is ``cost_affinity`` good enough everywhere?

At every point that ran all of them: the rule's *excess* over the best of the
baselines {sticky, margin 0/2/4/8, least-loaded} is the median over the paired
steps of ``t_rule / t_best - 1``, ``best`` being the baseline with the lowest
median change against sticky there (as ``benchmarks/rule_grid.py`` computes it);
it passes at a point when the excess is at most 1%. It *beats every peer* at a
point when its median change is below each peer policy's. A miss is
*significant* when even the smallest of its paired ratios is above 0 (for 6
steps, [min, max] covers the median with 96.9%).

The rule's constants were chosen on ``grid.RULE_SAMPLE`` (in-sample); every other
point is out-of-sample, and only those test the rule honestly.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from .grid import PEERS, RULE, RULE_SAMPLE, Point

BASELINES = ("sticky", "margin0", "margin2", "margin4", "margin8", "least_loaded")
TOLERANCE = 0.01
DIAGNOSTICS = ("hit_rate", "moved_share", "preemptions", "skew")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The criterion at one point."""

    point: dict[str, Any]  # the grid JSON's point
    in_sample: bool
    best: str  # the baseline of lowest median change vs sticky
    excess: float  # median over steps of t_rule / t_best - 1
    excess_low: float  # smallest and largest of those ratios
    excess_high: float
    beaten_by: tuple[str, ...]  # peers whose median change is at or below the rule's

    @property
    def within(self) -> bool:
        return self.excess <= TOLERANCE

    @property
    def significant(self) -> bool:
        return self.excess_low > 0

    @property
    def beats_peers(self) -> bool:
        return not self.beaten_by

    def change(self, label: str) -> float:
        """Median paired change of ``label`` vs sticky at this point."""
        return float(self.point["policies"][label]["change"]["median"])


def _key(p: dict[str, Any]) -> tuple:
    return (p["ctx"], p["kv"], p["conc"], p["lru"], p["replicas"], p["routers"], p["exchange_s"])


def _pkey(p: Point) -> tuple:
    return (p.ctx, p.kv, p.conc, p.lru, p.replicas, p.routers, None if math.isinf(p.exchange_s) else p.exchange_s)


SAMPLE_KEYS = frozenset(_pkey(p) for p in RULE_SAMPLE)


def evaluate(grid: dict[str, Any], rule: str = RULE) -> list[Verdict]:
    """The verdict at every point where the rule, every baseline and every peer ran."""
    out = []
    for p in grid["points"]:
        pol = p["policies"]
        if not all(a in pol for a in (rule, *BASELINES, *PEERS)):
            continue
        best = min(BASELINES, key=lambda b: pol[b]["change"]["median"])
        ratios = [r / b - 1 for r, b in zip(pol[rule]["step_seconds"], pol[best]["step_seconds"])]
        mine = pol[rule]["change"]["median"]
        beaten = tuple(a for a in PEERS if pol[a]["change"]["median"] <= mine)
        out.append(Verdict(p, _key(p) in SAMPLE_KEYS, best, statistics.median(ratios), min(ratios), max(ratios),
                           beaten))
    return out


@dataclasses.dataclass(frozen=True)
class Summary:
    points: int
    worst: Verdict | None
    within: int
    significant_misses: int
    beats_peers: int


def summarize(verdicts: list[Verdict]) -> Summary:
    worst = max(verdicts, key=lambda v: v.excess, default=None)
    return Summary(len(verdicts), worst, sum(v.within for v in verdicts),
                   sum(not v.within and v.significant for v in verdicts), sum(v.beats_peers for v in verdicts))


def split(verdicts: list[Verdict]) -> dict[str, list[Verdict]]:
    """In-sample, out-of-sample and all points."""
    return {"in-sample": [v for v in verdicts if v.in_sample], "out-of-sample": [v for v in verdicts if not v.in_sample],
            "all": verdicts}
