"""sim.rekey: a result cache carried over a change of the model's source that keeps every result, proven on a sample
first; and the fingerprint of a git revision's tree (sim.cache.fingerprint_at), the key it is carried from."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout_router.sim import rekey
from rollout_router.sim.cache import _PRESENTATION, ResultCache, fingerprint_at, model_fingerprint, task_key
from rollout_router.sim.verlgrid import describe, run_task

PACKAGE = Path(rekey.__file__).resolve().parents[1]
BEFORE = "the model before the refactor"  # the fingerprint the cache's rows were keyed by


@pytest.fixture(scope="module")
def quick():
    """Every step of verl grid ``quick`` (one point, 5 arms, 3 steps: 2 s) with its result, as the cache holds it."""
    return {t: json.loads(json.dumps(run_task(t))) for t in rekey.grid_tasks("quick")}


@pytest.fixture
def cache(tmp_path, quick, monkeypatch):
    """A cache of grid ``quick`` keyed by the model at revision ``before`` (every other revision is git's)."""
    path = tmp_path / "cache.jsonl"
    path.write_text("".join(json.dumps({"key": task_key(BEFORE, describe(t)), "result": r}) + "\n"
                            for t, r in quick.items()))
    monkeypatch.setattr(rekey, "fingerprint_at", lambda rev: BEFORE if rev == "before" else fingerprint_at(rev))
    return path


def run(cache, *flags):
    return rekey.main(["--cache", str(cache), "--grid", "quick", "--no-progress", *flags])


def test_an_unchanged_model_is_verified_on_a_sample_and_every_step_rekeyed(cache, quick, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(rekey, "run_task", lambda t: ran.append(t) or run_task(t))
    assert run(cache, "--from", "before", "--verify", "4") == 0
    out = capsys.readouterr().out
    assert "verified: 4 of grid quick's 15 steps cached under the model at before re-ran identically" in out
    assert "re-keyed 15 steps" in out
    assert len(ran) == 4 and len({t[1] for t in ran}) == 4 and ran[0][1] == "verl_margin0"  # a margin arm first
    assert len({t[2] for t in ran}) == 3  # every step
    store = ResultCache(cache)
    assert all(store.get(describe(t)) == r for t, r in quick.items())
    assert len(cache.read_text().splitlines()) == 30

    ran.clear()  # again: verified again, nothing appended (every step is under this tree's key already)
    assert run(cache, "--from", "before", "--verify", "2") == 0
    assert "nothing to re-key" in capsys.readouterr().out and len(ran) == 2
    assert len(cache.read_text().splitlines()) == 30


def test_a_changed_result_is_refused_and_nothing_written(cache, quick, monkeypatch, capsys):
    def changed(task):
        result = dict(quick[task])
        if task[1] == "verl_margin2":
            result["hit_rate"] = math.nextafter(result["hit_rate"], 1.0)  # one bit
        return result

    before = cache.read_bytes()
    monkeypatch.setattr(rekey, "run_task", changed)
    assert run(cache, "--from", "before", "--verify", "4") == 1
    err = capsys.readouterr().err
    assert "1 of 4 re-run steps differ" in err and "verl_margin2" in err and "hit_rate: cached" in err
    assert "Nothing was written" in err and err.count("\n") == 1
    assert cache.read_bytes() == before

    monkeypatch.setattr(rekey, "run_task", lambda t: {k: v for k, v in quick[t].items() if k != "turns"})
    assert run(cache, "--from", "before", "--verify", "1") == 1
    assert "turns: cached" in capsys.readouterr().err and cache.read_bytes() == before


def test_exact_means_the_same_json(quick):
    result = next(iter(quick.values()))
    assert rekey.first_difference(result, dict(result)) is None
    assert rekey.first_difference({"a": math.nan}, {"a": math.nan}) is None
    assert rekey.first_difference({"a": 0.0}, {"a": -0.0}) == "a: cached 0.0, now -0.0"
    assert rekey.first_difference({"a": 1.0}, {"a": 1.0, "b": 2}) == "b: not cached, now 2"


@pytest.mark.parametrize("flags, message", [
    (["--from", "no-such-revision-xyz"], "--from no-such-revision-xyz: not a revision of the repository at"),
    (["--from", "before", "--grid", "nosuch"], "--grid nosuch: no such verl grid (one of compare, group, quick"),
    (["--from", "HEAD"], "--from HEAD: none of grid quick's 15 steps is in --cache"),
])
def test_mistakes_are_one_line_naming_the_flag(cache, flags, message, capsys):
    before = cache.read_bytes()
    assert run(cache, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{rekey.PROG}: {message}") and err.count("\n") == 1, err
    assert cache.read_bytes() == before


def test_a_missing_cache_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        rekey.main(["--cache", str(tmp_path / "none.jsonl"), "--from", "HEAD", "--grid", "seed"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--cache" in err and "no such file" in err and err.count("\n") == 1


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_fingerprint_at_a_revision_is_the_trees(tmp_path):
    """In a repository of the package's sim and policy folders: at HEAD, what the checked-out tree gives; core's .py
    and .pxd count from their first commit, other files and presentation modules never."""
    package = tmp_path / "repo" / "router" / "rollout_router"
    for folder in ("sim", "policy"):
        (package / folder).mkdir(parents=True)
        for f in (PACKAGE / folder).glob("*.py"):
            shutil.copy(f, package / folder / f.name)
    git(tmp_path / "repo", "init", "-q")
    git(package, "add", ".")
    git(package, "commit", "-qm", "first")
    first = fingerprint_at("HEAD", package)
    assert first == model_fingerprint(package)

    core = package / "core"
    core.mkdir()
    (core / "README.txt").write_text("not source\n")
    assert model_fingerprint(package) == first
    (core / "sessions.py").write_text("class SessionTable: ...\n")
    (core / "sessions.pxd").write_text("cdef class SessionTable:\n    pass\n")
    moved = model_fingerprint(package)
    assert moved != first and fingerprint_at("HEAD", package) == first  # the tree, not the revision
    git(package, "add", ".")
    git(package, "commit", "-qm", "core")
    assert fingerprint_at("HEAD", package) == moved and fingerprint_at("HEAD~1", package) == first

    (package / "sim" / "rekey.py").write_text("# presentation\n")
    for chooser in ("__init__.py", "sources.py", "_built.pyx"):  # which core build runs, not what it computes
        (core / chooser).write_text("# the build's choice\n")
    assert model_fingerprint(package) == moved
    (core / "sessions.pxd").write_text("cdef class SessionTable:\n    cdef dict pins\n")
    assert model_fingerprint(package) != moved
    with pytest.raises(LookupError, match="not a revision"):
        fingerprint_at("no-such-revision", package)


def test_the_fingerprint_at_head_is_this_trees_when_clean():
    """The real repository: HEAD's fingerprint is the checkout's, unless a file the rule reads has changes."""
    try:
        listed = subprocess.run(["git", "-C", str(PACKAGE), "status", "--porcelain", "--", "sim", "policy", "core"],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    changed = [line for line in listed.splitlines()
               if not any(line.endswith(f"/sim/{name}") for name in _PRESENTATION)]
    if changed:
        pytest.skip("the model's source has changes not committed: " + "; ".join(changed))
    assert fingerprint_at("HEAD") == model_fingerprint()
