"""The margin this project tells users to set, from the study at the seed's scale (docs/simulator.md, "The study
at the seed's scale": 16 replicas of Qwen2.5-32B at TP 4, verl's ``tool_agent`` traffic).

One source for every place that names a margin to set: the README, ``rollout-router demo``'s last lines, the
Kubernetes example and the Helm chart's values and notes, the verl snippets in docs/integrations.md
(tests/test_advice.py checks each, and that this is what the study's table sets at the seed's point). The
defaults stay ``null`` (keep every pin, verl's behaviour), as the seed specifies: the settings, the CRD and the
verl adapter.
"""
from __future__ import annotations

MARGIN = 8  # affinityBreakMargin at the seed's point: the fastest margin faster than sticky in 9 or 10 of 10 steps
