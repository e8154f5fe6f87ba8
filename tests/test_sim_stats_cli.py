"""Paired statistics and the quick preset through the CLI entry point."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from rollout_router import sim
from rollout_router.sim.stats import median_ci, sign_test, summarize, wilcoxon


def test_sign_test_exact_values():
    assert sign_test([-1] * 10) == pytest.approx(2 / 2**10)
    assert sign_test([1, -1]) == 1.0
    assert sign_test([0, 0]) == 1.0


def test_wilcoxon_detects_shift_and_not_noise():
    rng = np.random.default_rng(0)
    assert wilcoxon(rng.normal(-1, 0.5, 30)) < 1e-4
    assert wilcoxon(np.array([-3, 1, -1, 3, 2, -2.0])) > 0.5


def test_summary_of_paired_changes():
    s = summarize([90, 95, 99, 80], [100, 100, 100, 100])
    assert s["median"] == pytest.approx(-0.075)
    assert s["wins"] == 4 and s["n"] == 4
    assert (s["ci_low"], s["ci_high"], s["coverage"]) == (pytest.approx(-0.2), pytest.approx(-0.01), 0.875)
    assert median_ci([-0.1, -0.05, -0.01, -0.2])[:2] == (-0.2, -0.01)


def test_quick_preset_json(capsys):
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    args = parser.parse_args(["--preset", "quick", "--steps", "3", "--jobs", "1", "--json", "--no-progress"])
    assert sim.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    pol = out["policies"]
    expected = {a.label for a in sim.arms_for(sim.PRESETS["quick"])}
    assert set(pol) == expected
    for m in pol.values():
        assert m["median_step_seconds"] > 0
        assert 0 <= m["prefix_hit_rate"] <= 1
        assert set(m["paired_change_vs_sticky"]) >= {"median", "ci_low", "ci_high", "sign_p", "wilcoxon_p"}
    assert pol["sticky"]["paired_change_vs_sticky"]["median"] == 0
    lb = out["presets"]["quick"]["lower_bound"]
    assert all(m["median_step_seconds"] >= lb["lb"] for m in pol.values())
    # round robin ignores sessions, so it reuses the prefix cache less than sticky
    assert pol["round_robin"]["prefix_hit_rate"] < pol["sticky"]["prefix_hit_rate"]


def test_plots_are_written(tmp_path):
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    args = parser.parse_args(["--preset", "quick", "--steps", "2", "--jobs", "1", "--no-progress",
                              "--policies", "ours_margin2", "--plots", str(tmp_path)])
    assert sim.run(args) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"sim-load-quick.png", "sim-steps-quick.png"}
