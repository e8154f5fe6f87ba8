"""`rollout-router demo` (issue 19): a verl-shaped rollout, paired rounds, one verdict line per arm."""
from __future__ import annotations

import argparse

from rollout_router.demo import BASELINE, COLUMNS, add_arguments, run, verdicts
from rollout_router.demo.driver import ArmResult
from rollout_router.demo.workload import MAX_TOOL_CHARS, rollout, tool_text


def _runs(name: str, walls: list[float]) -> list[ArmResult]:
    return [ArmResult(name, w, [0.1], [0], {"affinity_kept": 0, "affinity_broken": 0}, 0.5, 0) for w in walls]


def test_verdict_names_a_difference_only_when_the_interval_excludes_zero():
    results = {BASELINE: _runs(BASELINE, [10, 10, 10]), "slow": _runs("slow", [11, 12, 11.5]),
               "fast": _runs("fast", [9, 9.5, 9.2]), "same": _runs("same", [9.5, 10.5, 10.1])}
    slow, fast, same = verdicts(results)
    assert slow.startswith("slow vs sticky: slower (median +15.0%, 75% interval [+10.0%, +20.0%])")
    assert fast.startswith("fast vs sticky: faster")
    assert same.startswith("same vs sticky: no difference detectable in 3 paired rounds")


def test_rollout_is_verl_shaped():
    convs = rollout(3, 4, seed=1)
    assert len({c.key for c in convs}) == 12  # one key per trajectory, siblings apart
    assert len({c.prompt.split(" w")[0] for c in convs}) == 1  # one shared system prompt + instruction
    assert max(len(c.turns) for c in convs) <= 8
    assert all(len(tool_text(c, i)) <= MAX_TOOL_CHARS + len("...(truncated)...") for c in convs
               for i in range(len(c.turns)))
    assert rollout(1, 1, seed=2)[0].prompt[:20] != convs[0].prompt[:20]  # a new round shares no block


def test_demo_prints_the_table_a_line_per_column_and_a_verdict_per_arm(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--replicas", "2", "--prompts", "2", "--samples", "2", "--rounds", "3", "--seed-steps", "0",
                              "--margins", "0,8.5"])
    assert run(args) == 0
    out = capsys.readouterr().out
    for column in COLUMNS:
        assert f"  {column}: " in out
    lines = [line for line in out.splitlines() if " vs sticky: " in line]
    assert len(lines) == 3 and all("paired rounds" in line for line in lines)
    assert [line.split(" vs sticky")[0] for line in lines] == ["no affinity (least_loaded)", "margin 0", "margin 8.5"]
