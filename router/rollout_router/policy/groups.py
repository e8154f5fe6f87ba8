"""GRPO siblings together: where a new session of a group is placed.

An RL trainer sends the n samples of one prompt (GRPO siblings) at once; they
share the whole prompt, so on one replica the prompt is prefilled once and the
other n-1 hit the prefix cache, while spread over the fleet each replica
prefills it anew. A caller-supplied group key (the prompt's id) lets the policy
place a *new* session on the replica its group's last member went to, while
that replica is within the margin of the least-loaded one, and where the policy
would have placed it otherwise. Later turns follow the session's own pin and
margin as before: the group decides a session's first replica only.

* ``margin`` is the session margin (``affinity_break_margin``). ``None`` (verl's
  sticky default) keeps every group together whatever the load, as verl's
  ``GroupStickyLoadBalancer`` (PR #6122) and llm-d's ``burst-prefix-cache-producer``
  (``maxPerReplica: -1``) do: a null margin means "affinity before load" for
  pins and groups alike.
* A group follows its latest member: a member that spills re-points the group
  at its replica (which now holds the prompt too), so the next members join it
  there rather than each spilling to a different replica (llm-d fills one
  replica, then spills to the next one and stays there).
* Under ``full_determinism`` a member goes to the rendezvous replica of its
  group key: siblings land together and the choice depends only on the group
  key and the replica set.

The map is bounded (``max_groups``, least recently used evicted first; a group
lives for one RL step, so 10,000 is verl's sticky-cache size, ample for a
batch) and is dropped with the pins on a phase switch (``release_all``).
``group_colocated`` counts members placed on their group's replica,
``group_spilled`` members placed elsewhere because that replica was beyond the
margin or gone; a group's first member is neither.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from ..core.kept import within
from .base import Counters
from .hashing import rendezvous


class GroupTable:
    """Group key -> the replica its latest member was placed on; LRU-bounded, time-free."""

    def __init__(self, counters: Counters, max_groups: int = 10_000):
        self._replicas: OrderedDict[str, str] = OrderedDict()
        self._counters = counters
        self.max_groups = max_groups
        self.resize(max_groups)

    def __len__(self) -> int:
        return len(self._replicas)

    def resize(self, max_groups: int) -> None:
        """Apply a new bound live; groups beyond it are evicted least recently used first."""
        if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
            raise ValueError(f"max_groups must be an integer >= 1, got {max_groups!r}")
        self.max_groups = max_groups
        while len(self._replicas) > max_groups:
            self._replicas.popitem(last=False)

    def place(self, group: str, loads: Mapping[str, float], chosen: str, margin: float | None,
              deterministic: bool = False) -> str:
        """The replica for a new member of ``group``: the group's while within ``margin`` of the least-loaded
        (None: always), else ``chosen`` (the policy's own placement); ``deterministic``: the group key's
        rendezvous replica. Counted, and the group re-pointed at the answer."""
        current = self._replicas.get(group)
        if deterministic:
            target = rendezvous(group, loads)
        elif current is not None and current in loads and (margin is None or within(loads, loads[current], margin)):
            target = current
        else:
            target = chosen
        if current is not None:
            if target == current:
                self._counters.group_colocated += 1
            else:
                self._counters.group_spilled += 1
        self._replicas[group] = target
        self._replicas.move_to_end(group)
        if len(self._replicas) > self.max_groups:
            self._replicas.popitem(last=False)
        return target

    def held(self) -> list[tuple[str, str]]:
        """Every group's replica, least recently placed first."""
        return list(self._replicas.items())

    def restore(self, group: str, replica: str) -> None:
        """Point ``group`` at ``replica`` again (a saved placement), nothing counted; the bound holds."""
        self._replicas[group] = replica
        self._replicas.move_to_end(group)
        if len(self._replicas) > self.max_groups:
            self._replicas.popitem(last=False)

    def clear(self) -> int:
        """Forget every group (a phase switch: the next step's prompts are new); returns how many."""
        dropped = len(self._replicas)
        self._replicas.clear()
        return dropped
