"""Adapters that run RolloutRouter's routing policy inside other frameworks' processes.

Each adapter imports nothing from its framework, so ``rollout_router`` installs without it;
the framework imports the adapter (by class or by dotted name) and drives it.
"""
