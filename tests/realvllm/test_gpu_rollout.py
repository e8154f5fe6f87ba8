"""benchmarks/gpu_rollout.py end to end on vLLM's CPU build: it starts the replicas and a router per arm, runs
paired steps of a verl-shaped tool_agent rollout, and prints each arm's step time and vLLM's own prefix-cache hit
rate beside the simulator's prediction. A function test: no step time is judged here."""
from __future__ import annotations

import re
import subprocess
import sys

from .conftest import ROOT, TINY_MODEL_DIR, VLLM_PYTHON


def test_gpu_rollout_runs_both_arms_on_real_vllm_and_reads_its_prefix_hits():
    command = [sys.executable, "benchmarks/gpu_rollout.py", "--device", "cpu", "--vllm-python", str(VLLM_PYTHON),
               "--model", str(TINY_MODEL_DIR), "--served-model-name", "tiny", "--replicas", "2", "--steps", "2",
               "--trajectories", "6", "--out-tokens", "8", "--max-turns", "3", "--tool-seconds", "0.2",
               "--tool-tokens", "64"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "step 2/2: sticky" in output and "2 replicas, 6 trajectories a step, 2 paired steps" in output, output
    rows = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in
            re.finditer(r"^\s*(sticky|margin 2)\s+([\d.]+)\s+([\d.]+)%\s+[\d.]+%$", output, re.M)}
    assert set(rows) == {"sticky", "margin 2"}, output
    assert all(seconds > 0 for seconds, _ in rows.values())
    assert rows["sticky"][1] > 0  # a turn after the first finds its prefix: vLLM's own counters were read
    assert re.search(r"paired change of margin 2 against sticky: measured [+-][\d.]+% .* simulated \(.*\): "
                     r"[+-][\d.]+%", output), output
