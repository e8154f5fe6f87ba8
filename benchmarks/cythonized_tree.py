"""A copy of the router's package with the modules a lane request's route and finish run through compiled by
Cython as they are: does compiling the routing's Python, unchanged, make it cheaper? (docs/benchmarks.md)

    .venv/bin/python benchmarks/cythonized_tree.py OUT
    .venv/bin/python benchmarks/proxy_cost.py --rounds 3 --seconds 4 --baseline-src OUT/router \\
        --arms "ours (sticky),lane floor (routing stubbed),HAProxy 2.6 (one thread),nginx 1.22 (one worker)"

``ours (sticky, baseline src)`` is then the compiled copy beside the interpreted tree. Each compiled module sits
next to its ``.py``, which Python imports it in place of. Needs Cython and a C compiler (``make test`` installs
Cython). An experiment, not a build: the router never ships these.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("proxy/http/lane/glue.py", "proxy/attempts.py", "proxy/outcome.py", "balancer.py", "policy/affinity.py",
           "policy/sessions.py", "replicas.py", "policy/loads.py", "observability.py", "tallies.py", "proxy/turns.py",
           "health/outliers.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an empty or new directory: OUT/router is the copy")
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out}: not empty")
    from Cython.Build import cythonize
    from setuptools import Distribution  # type: ignore[import-untyped]

    shutil.copytree(ROOT / "router", args.out / "router", ignore=shutil.ignore_patterns("__pycache__"))
    package = args.out / "router"
    sources = [str(package / "rollout_router" / module) for module in MODULES]
    extensions = cythonize(sources, build_dir=str(args.out / "cython"), quiet=True,
                           compiler_directives={"language_level": 3, "annotation_typing": False})
    command = Distribution({"ext_modules": extensions}).get_command_obj("build_ext")
    command.build_lib, command.build_temp = str(package), str(args.out / "temp")
    command.ensure_finalized()
    command.run()
    print(f"{args.out / 'router'}: {len(extensions)} modules compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
