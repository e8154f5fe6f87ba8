"""The replicas' weight versions: what a replica or a peer says goes into every answer's head, so only what a head
can carry is kept, and only so many of them."""
from __future__ import annotations

import pytest

from rollout_router.fleet.rlstate import MAX_VERSIONS, RlState
from rollout_router.settings import RlSettings


@pytest.fixture
def rl() -> RlState:
    return RlState(RlSettings)


@pytest.mark.parametrize("version", ["step-2", "v 1.0", "a", "x" * 256, "ckpt/step_00042:ema"])
def test_a_version_a_head_can_carry_is_kept(rl, version):
    assert rl.set_version("http://r:8000", version) and rl.versions == {"http://r:8000": version}


@pytest.mark.parametrize("version", ["v1\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK", "v1\n", "v\x00", "\udcff",
                                     "é", "", " v", "v ", "x" * 257, 3, None, ["v"]])
def test_a_version_that_would_split_or_break_a_head_is_not_kept(rl, version):
    rl.set_version("http://r:8000", "step-1")
    assert not rl.set_version("http://r:8000", version)
    assert rl.versions == {"http://r:8000": "step-1"}


def test_a_peers_versions_are_checked_and_bounded(rl):
    """A peer with a newer epoch: its versions are merged, but a peer cannot make this router hold more than
    ``MAX_VERSIONS`` (what every /fleet/v1/loads line carries on), nor a version a head cannot carry."""
    versions = {f"http://10.0.{i // 250}.{i % 250}:8000": f"step-{i}" for i in range(3 * MAX_VERSIONS)}
    versions.update({"http://bad:1": "v\r\nX-Forged: 1", "x" * 10_000: "step-1"})
    assert rl.adopt({"epoch": [5, "peer"], "paused": False, "versions": versions})
    assert len(rl.versions) == MAX_VERSIONS
    assert all("\r" not in v for v in rl.versions.values()) and all(len(k) < 10_000 for k in rl.versions)


def test_the_versions_kept_are_the_newest(rl):
    for i in range(MAX_VERSIONS + 10):
        rl.set_version(f"r{i}", "step-1")
    rl.set_version("r20", "step-2")  # read again: the newest now
    assert len(rl.versions) == MAX_VERSIONS and "r0" not in rl.versions and "r9" not in rl.versions
    assert next(reversed(rl.versions)) == "r20" and rl.versions["r20"] == "step-2"
