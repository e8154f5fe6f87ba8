"""The demo's second part: the seed's scale, in the fleet simulator.

The live part runs a few simulated replicas on this machine; a user's fleet is larger. So the demo ends with one
point of the study at the seed's scale (docs/simulator.md): 16 replicas of Qwen2.5-32B at TP 4 on H200, verl's
``tool_agent`` traffic, verl's sticky balancer against the margin the advice sets there (``advice.MARGIN``), on
paired steps, and a verdict from the same sign test the study's table uses.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..advice import MARGIN
from ..sim.stats import summarize
from ..sim.verlgrid import SEED_POINT, run_task

SIGN_ALPHA = 0.05


def arms() -> tuple[str, str]:
    return "verl_sticky", f"verl_margin{MARGIN}"


def steps(count: int) -> Iterator[tuple[float, float]]:
    """Each paired step's (sticky, margin) step seconds, as it is simulated."""
    sticky, margin = arms()
    for step in range(count):
        yield run_task((SEED_POINT, sticky, step, 0))["step_seconds"], run_task((SEED_POINT, margin, step, 0))["step_seconds"]


def verdict(pairs: list[tuple[float, float]]) -> str:
    change = summarize([m for _, m in pairs], [s for s, _ in pairs])
    faster = change["sign_p"] < SIGN_ALPHA and change["median"] < 0
    slower = change["sign_p"] < SIGN_ALPHA and change["median"] > 0
    word = "faster" if faster else "slower" if slower else "no difference shown"
    return (f"margin {MARGIN} vs sticky at the seed's scale: {word} (median {change['median']:+.1%}, faster in "
            f"{change['wins']} of {change['n']} steps, sign test p={change['sign_p']:.2g})")
