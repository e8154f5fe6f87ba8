"""One source for the margin users are told to set (``advice.MARGIN``): it is what the study at the seed's scale
sets at the seed's point (its committed result cache), and every place that names a margin to set names it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rollout_router.advice import MARGIN
from rollout_router.demo import HOW_TO_USE, seedscale
from rollout_router.sim.cache import ResultCache
from rollout_router.sim.seedreport import CACHE, SETTINGS, advice, results
from rollout_router.sim.verlgrid import SEED_POINT

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    found, _ = results(ResultCache(ROOT / CACHE))
    assert SEED_POINT in found and all(arm in found[SEED_POINT] for arm in SETTINGS), "the seed's point has run"
    return found


def test_the_advised_margin_is_what_the_study_sets_at_the_seeds_point(study):
    row = next(line for line in advice({SEED_POINT: study[SEED_POINT]}).splitlines() if line.startswith("| 16 |"))
    assert f"| `{MARGIN}` |" in row, row


def test_the_demo_simulates_the_studys_steps_and_its_verdict_is_the_tables(study):
    """The demo's seed-scale part runs the study's seed point: its first steps are the cache's, and its verdict over
    its default six steps (from the cache) says the advised margin is faster, as the table does."""
    cache = ResultCache(ROOT / CACHE)
    from rollout_router.sim.verlgrid import describe
    sticky, margin = seedscale.arms()
    cached = [(cache.get(describe((SEED_POINT, sticky, s, 0)))["step_seconds"],
               cache.get(describe((SEED_POINT, margin, s, 0)))["step_seconds"]) for s in range(6)]
    assert list(seedscale.steps(1)) == cached[:1]
    assert "faster" in seedscale.verdict(cached) and f"margin {MARGIN} vs sticky" in seedscale.verdict(cached)


def test_every_place_that_names_a_margin_to_set_names_the_advised_one():
    assert f"--affinity-break-margin {MARGIN}" in HOW_TO_USE
    example = yaml.safe_load((ROOT / "docs/examples/rolloutrouter.yaml").read_text())
    assert example["spec"]["affinityBreakMargin"] == MARGIN
    values = yaml.safe_load((ROOT / "charts/rollout-router/values.yaml").read_text())
    assert _margins(yaml.safe_dump(values)) == {MARGIN}
    assert _margins((ROOT / "charts/rollout-router/templates/NOTES.txt").read_text()) == {MARGIN}
    integrations = (ROOT / "docs/integrations.md").read_text()
    assert set(int(m) for m in re.findall(r"affinity_break_margin[:=] ?(\d+)", integrations)) == {MARGIN}
    readme = (ROOT / "README.md").read_text()
    assert f"--affinity-break-margin {MARGIN}" in readme and f"affinityBreakMargin: {MARGIN}" in readme


# Where a user copies a margin from: the docs' examples of what to run or apply, the chart's values and examples.
COPIED_FROM = ["README.md", "docs/configuration.md", "docs/kubernetes.md", "docs/operator.md", "docs/integrations.md",
               "docs/examples/rolloutrouter.yaml", "docs/examples/rolloutrouter-full.yaml",
               "charts/rollout-router/values.yaml", "charts/rollout-router/ci/example-values.yaml",
               "charts/rollout-router/templates/NOTES.txt"]


@pytest.mark.parametrize("path", COPIED_FROM)
def test_every_margin_a_user_copies_is_the_advised_one(path):
    """Each `affinityBreakMargin: N`, `--affinity-break-margin N` and `affinity_break_margin=N` in a file a user
    copies from names the advised margin (``kubectl get rr``'s MARGIN column in the docs' captures too)."""
    text = (ROOT / path).read_text()
    found = _margins(text) | {int(m) for m in re.findall(r"(?:--affinity-break-margin|affinity_break_margin[:=]) ?(\d+)",
                                                         text)}
    found |= {int(m) for m in re.findall(r"^rollouts +(\d+) ", text, re.MULTILINE)}
    assert found == {MARGIN}, f"{path} names margins {sorted(found)}, the advice is {MARGIN}"


def _margins(text: str) -> set[int]:
    return {int(m) for m in re.findall(r"affinityBreakMargin: (\d+)", text)}
