"""Maps the folders router/ and operator/ to their import packages (see pyproject.toml)."""
from setuptools import find_packages, setup


def _mapped(folder: str, name: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(folder)]


setup(packages=_mapped("router", "rollout_router") + _mapped("operator", "rollout_router_operator"))
