"""Carry a verl grid's result cache over a change of the model that keeps every result, proven on a sample.

The cache (``sim.cache``) keys each finished step by the source of the model that computed it, so a refactor of
the simulator or of the policies (their hot state moved to ``core``, compiled) misses every step, though it means
to compute the same numbers. This finds the grid's steps the model at git revision ``--from`` computed, re-runs
``--verify`` of them with this tree's code (spread over the points and the arms: the seed's point first, the margin
arms in turn with the others) and compares each with its cached result exactly (the whole result, after a JSON
round trip). Only if every one is identical does it append the grid's steps again under this tree's key, with the
cached results; steps already under this tree's key are skipped, so a second run (or ``--from`` a revision whose
model is this tree's) appends nothing. If one differs it writes nothing, prints the first difference and exits 1.

    .venv/bin/python -m rollout_router.sim.rekey --cache benchmarks/results/seed-cache.jsonl --from REV \
        --grid seed --verify 12

Mistakes (a revision git does not know, a grid that does not exist, no step of the grid in the cache under
``--from``'s model) are one line and exit 2.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import usage
from ..usage import UsageError
from .cache import ResultCache, fingerprint_at, task_key
from .parallel import run_tasks
from .verlgrid import SEED_POINT, VERL_GRIDS, Task, VPoint, describe, plan, run_task

PROG = "python -m rollout_router.sim.rekey"


def grid_tasks(grid: str, seed: int = 0) -> list[Task]:
    """Every step of verl grid ``grid`` as ``simulate --verl-grid`` runs it, in the grid's order."""
    spec = VERL_GRIDS[grid]
    return [(p, a, s, seed) for p, arms in plan(spec["blocks"]).items() for a in arms for s in range(spec["seeds"])]


def sample(tasks: Sequence[Task], n: int) -> list[Task]:
    """``n`` of ``tasks``, chosen the same way every time: evenly spaced over the points (the seed's point, if there,
    first), the arms taken in turn (a margin arm, then another, ...), the steps too."""
    if n >= len(tasks):
        return list(tasks)
    by_point: dict[VPoint, list[Task]] = {}
    for t in tasks:
        by_point.setdefault(t[0], []).append(t)
    points = sorted(by_point, key=lambda p: p != SEED_POINT)
    turn = {arm: i for i, arm in enumerate(_arm_turns(list(dict.fromkeys(t[1] for t in tasks))))}
    steps = 1 + max(t[2] for t in tasks)
    chosen: list[Task] = []
    for i in range(n):
        start = i * len(points) // n if n <= len(points) else i % len(points)
        left: list[Task] = []
        for k in range(len(points)):
            left = [t for t in by_point[points[(start + k) % len(points)]] if t not in chosen]
            if left:
                break
        chosen.append(min(left, key=lambda t: ((turn[t[1]] - i) % len(turn), (t[2] - i) % steps)))
    return chosen


def _arm_turns(arms: list[str]) -> list[str]:
    """The arms in the order the sample takes them: the margin arms and the others alternating, a margin first."""
    margins = [a for a in arms if "margin" in a]
    others = [a for a in arms if a not in margins]
    return [a for pair in itertools.zip_longest(margins, others) for a in pair if a is not None]


def canonical(result: Any) -> str:
    """A result as the cache holds it, as text: equal texts are the same numbers, bit for bit (NaN included)."""
    return json.dumps(result, sort_keys=True)


def first_difference(cached: Any, now: Any) -> str | None:
    """Where ``now`` (this tree's result, after a JSON round trip) differs from ``cached``, or None."""
    now = json.loads(json.dumps(now))
    if canonical(cached) == canonical(now):
        return None
    if not (isinstance(cached, dict) and isinstance(now, dict)):
        return f"cached {canonical(cached)}, now {canonical(now)}"
    for name in [*cached, *(k for k in now if k not in cached)]:
        if name not in now:
            return f"{name}: cached {canonical(cached[name])}, now missing"
        if name not in cached:
            return f"{name}: not cached, now {canonical(now[name])}"
        if canonical(cached[name]) != canonical(now[name]):
            return f"{name}: cached {canonical(cached[name])}, now {canonical(now[name])}"
    return None  # pragma: no cover - the texts differ, so some field does


def label(task: Task) -> str:
    point, arm, step, seed = task
    return f"{point.label}, {arm}, step {step}" + (f", seed {seed}" if seed else "")


def rekey(cache_path: str, rev: str, grid: str, verify: int, jobs: int = 1, progress: bool = True,
          out: Any = None) -> int:
    """The command: 0 re-keyed (or nothing left to), 1 a sampled step differs (nothing written). A ``UsageError``
    for a mistake."""
    out = out or sys.stdout
    if grid not in VERL_GRIDS:
        raise UsageError(f"--grid {grid}: no such verl grid (one of {', '.join(sorted(VERL_GRIDS))})")
    try:
        old = fingerprint_at(rev)
    except LookupError as error:
        raise UsageError(f"--from {rev}: {error}") from None
    store = ResultCache(cache_path)
    new = store.fingerprint
    tasks = grid_tasks(grid)
    found = [(t, store.stored(task_key(old, describe(t)))) for t in tasks]
    cached = {t: r for t, r in found if r is not None}
    if not cached:
        raise UsageError(f"--from {rev}: none of grid {grid}'s {len(tasks):,} steps is in --cache {cache_path} under "
                         f"the model at {rev} (fingerprint {old}); name the revision whose model computed them")
    chosen = sample(list(cached), verify)
    started = time.monotonic()
    rerun = run_tasks(run_task, chosen, jobs=jobs, progress=progress, desc=f"verifying {grid}")
    seconds = time.monotonic() - started
    differing = [(t, d) for t, r in zip(chosen, rerun) if (d := first_difference(cached[t], r)) is not None]
    if differing:
        task, where = differing[0]
        print(f"{PROG}: this tree's model differs from the one at {rev}: {len(differing)} of {len(chosen)} re-run "
              f"steps differ; the first, {label(task)}: {where}. Nothing was written.", file=sys.stderr)
        return 1
    rows: dict[str, Any] = {}
    for t, result in cached.items():
        key = task_key(new, describe(t))
        if store.stored(key) is None:
            rows.setdefault(key, result)
    store.put_keyed(rows.items())
    points = len({t[0] for t in chosen})
    arms = len({t[1] for t in chosen})
    verified = (f"verified: {len(chosen)} of grid {grid}'s {len(cached):,} steps cached under the model at {rev} "
                f"re-ran identically with this tree's ({_count(points, 'point')}, {_count(arms, 'arm')}, "
                f"{seconds:.0f} s)")
    if old == new:
        print(f"{verified}; the model at {rev} is this tree's: nothing to re-key", file=out)
    elif not rows:
        print(f"{verified}; all {len(cached):,} are already under this tree's key: nothing to re-key", file=out)
    else:
        print(f"{verified}; re-keyed {len(rows):,} steps to this tree's model ({new}; "
              f"{len(cached) - len(rows):,} were already under it) in {cache_path}", file=out)
    return 0


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


class _Parser(argparse.ArgumentParser):
    """Mistakes in one line (the flag as written, what is wrong), exit 2, as ``rollout-router``'s own."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--cache", required=True, metavar="FILE", type=usage.existing_file,
                        help="the result cache (e.g. benchmarks/results/seed-cache.jsonl); rows are appended to it")
    parser.add_argument("--from", required=True, dest="rev", metavar="REV",
                        help="the git revision whose model computed the cached steps (a commit, tag or branch)")
    parser.add_argument("--grid", required=True, metavar="NAME",
                        help=f"the verl grid the cache holds ({', '.join(sorted(VERL_GRIDS))})")
    parser.add_argument("--verify", type=usage.at_least(1), default=12, metavar="N",
                        help="steps to re-run with this tree's code and compare (default %(default)s)")
    parser.add_argument("--jobs", type=usage.at_least(1), default=1, help="worker processes (default %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        return rekey(args.cache, args.rev, args.grid, args.verify, jobs=args.jobs, progress=not args.no_progress)
    except UsageError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
