"""Discrete-event simulator of a vLLM fleet driven by the router's own policies.

``add_arguments`` / ``run`` are the ``rollout-router simulate`` command;
``python -m rollout_router.sim`` runs the same thing. See docs/simulator.md.
"""
from .cli import add_arguments, main, run
from .cost import CostModel
from .engine import Arm, StepResult, run_step
from .runner import Config, arms_for, run_study
from .workload import PRESETS, Preset, generate

__all__ = ["PRESETS", "Arm", "Config", "CostModel", "Preset", "StepResult", "add_arguments", "arms_for",
           "generate", "main", "run", "run_step", "run_study"]
