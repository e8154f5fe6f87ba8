"""Finds the packages under their folders: router/ is rollout_router, and operator/ holds
rollout_router_operator (see pyproject.toml)."""
from setuptools import find_packages, setup


def _mapped(folder: str, name: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(folder)]


OPERATOR = "operator/rollout_router_operator"
setup(packages=_mapped("router", "rollout_router") + _mapped(OPERATOR, "rollout_router_operator"))
