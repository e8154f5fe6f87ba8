"""What ``rollout-router simulate`` prints for a small run: no table without rows, arm names a reader
knows (not the labels ``--policies`` takes), and titles that fit their figure."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from rollout_router.sim.plots import fit_title
from rollout_router.sim.report import ARM_NAMES, arm_name
from rollout_router.sim.runner import arms_for
from rollout_router.sim.workload import PRESETS

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))


def simulate(*args: str) -> str:
    done = subprocess.run([SCRIPT, "simulate", "--jobs", "1", "--no-progress", *args], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def header_only_tables(text: str) -> list[str]:
    """Tables of a markdown text that have a header and a separator and nothing else."""
    tables = re.findall(r"(?:^\|.*\n)+", text + "\n", re.M)
    return [t for t in tables if len(t.splitlines()) <= 2]


def test_a_preset_run_prints_no_empty_table_and_no_internal_arm_name():
    out = simulate("--preset", "quick", "--steps", "2")
    assert not header_only_tables(out) and "Reproduced table" not in out and "none of these presets" in out
    assert not re.search(r"\b(ours_margin\d|cand_\w+|consistent_hash_c|dual_threshold_abs)", out), out
    assert "| margin 2 |" in out and "| sticky (margin null) |" in out


def test_every_arm_has_a_printed_name():
    arms = arms_for(PRESETS["quick"], margins=(8, 2.5))
    unnamed = [a.label for a in arms if a.label not in ARM_NAMES and not a.label.startswith("ours_margin")]
    assert not unnamed, unnamed
    assert [arm_name(arm.label) for arm in arms][-2:] == ["margin 8", "margin 2.5"]


def test_simulate_runs_any_margin_it_is_given():
    """``--margins 8`` adds our rule at margin 8 beside sticky; ``--list-policies`` lists it."""
    listed = simulate("--preset", "quick", "--margins", "8", "--list-policies")
    assert re.search(r"^ours_margin8 +margin 8$", listed, re.MULTILINE), listed
    out = simulate("--preset", "quick", "--steps", "2", "--margins", "8", "--policies", "ours_margin8")
    assert "| margin 8 |" in out and "| sticky (margin null) |" in out and "| margin 2 |" not in out


def test_a_small_grid_prints_no_header_only_table(tmp_path):
    out = simulate("--grid", "quick", "--seeds", "2")
    assert not header_only_tables(out), header_only_tables(out)
    assert "No point of grid 'quick' belongs in this table" in out


def test_a_figure_title_fits_a_one_column_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(4.8, 6), layout="constrained")  # the quick grid's heatmap: one context column
    fit_title(fig, "Median paired change of step time vs sticky, % (3 steps per cell; * the interval excludes 0)")
    fig.canvas.draw()
    box, title = fig.bbox, fig.get_suptitle() and fig._suptitle.get_window_extent()
    plt.close(fig)
    assert box.x0 <= title.x0 and title.x1 <= box.x1


def test_list_policies_with_a_grid_lists_the_grids_arms_and_runs_nothing(capsys):
    from rollout_router.sim.cli import run
    from rollout_router.sim.verlgrid import SEED

    class Args:
        list_policies, grid, verl_grid, from_json = True, None, "seed", None

    assert run(Args()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(SEED) and all(line.endswith("21 points") for line in lines)
