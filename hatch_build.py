"""Builds the HTTP traffic port's native lane (router/rollout_router/proxy/http/lane/_lane.pyx) and the hot state it
calls (router/rollout_router/core: plain Python modules with ``.pxd`` interfaces) at install time.

Cython turns the lane and the core into C and the machine's C compiler builds it. Without either the install goes on
without the lane, and the router runs its pure-Python data path, which it always keeps (``lane/glue.py`` says
which one a router runs; ``--data-path native`` refuses to start without the lane). hatchling runs this as
its build hook (pyproject.toml ``[tool.hatch.build.hooks.custom]``): an editable install builds the module in
place, next to its source, as ``make`` does after an edit (``python hatch_build.py``); a wheel carries it.
The built module records a hash of its sources (``SOURCE_HASH``), so a router never runs a lane older than
the sources beside it (``lane/sources.py`` computes it, for this file and for ``lane/glue.py``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "router" / "rollout_router" / "proxy" / "http" / "lane"
MODULE = "rollout_router.proxy.http.lane._lane"
GRPC = ROOT / "router" / "rollout_router" / "proxy" / "grpc"
FRAMES = "rollout_router.proxy.grpc._grpc_frames"  # the gRPC relay's frame engine, built beside the lane
CORE = ROOT / "router" / "rollout_router" / "core"  # compiled first: the lane cimports its .pxd


def _sources(path: Path = PACKAGE / "sources.py") -> ModuleType:
    """``lane/sources.py`` (or the frame engine's ``frame_sources.py``), loaded by its path: the package's
    dependencies need not be installed yet."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(work: Path, target: Path | None = None, flags: tuple[str, ...] = ()) -> Path:
    """Compile the lane into PACKAGE (in place), or into ``target`` with extra compiler and linker ``flags`` (the
    sanitizers' build, tests/test_lane_asan.py); returns the built module's path. Raises when Cython or the
    compiler is missing or fails."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    def extension(name: str, source: Path) -> Extension:
        return Extension(name, [str(source)], extra_compile_args=["-O2", *flags], extra_link_args=list(flags))

    core = _sources(CORE / "sources.py")
    hashes = {"LANE_SOURCE_HASH": _sources().source_hash(PACKAGE),
              "GRPC_FRAMES_SOURCE_HASH": _sources(GRPC / "frame_sources.py").source_hash(GRPC),
              "CORE_SOURCE_HASH": core.source_hash(CORE)}
    options = {"build_dir": str(work / "cython"), "quiet": True, "language_level": 3, "force": True,
               "include_path": [str(ROOT / "router")], "compile_time_env": hashes}
    # the core's annotations are for mypy: its .pxd files alone say what Cython types
    modules = cythonize([extension(f"rollout_router.core.{name}", CORE / f"{name}.py") for name in core.COMPILED]
                        + [extension("rollout_router.core._built", CORE / "_built.pyx")],
                        compiler_directives={"annotation_typing": False}, **options)
    modules += cythonize([extension(MODULE, PACKAGE / "_lane.pyx"), extension(FRAMES, GRPC / "_grpc_frames.pyx")],
                         **options)
    distribution = Distribution({"ext_modules": modules, "package_dir": {"": "router"}})
    command = distribution.get_command_obj("build_ext")
    command.inplace = target is None
    if target is not None:
        command.build_lib = str(target)
    command.build_temp = str(work / "temp")
    command.ensure_finalized()
    previous = Path.cwd()
    try:
        os.chdir(ROOT)  # build_ext --inplace writes relative to the package_dir
        command.run()
    finally:
        os.chdir(previous)
    built = (PACKAGE if target is None else target / "rollout_router" / "proxy" / "http" / "lane") / \
        f"_lane{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not built.exists():
        raise RuntimeError(f"the build left no {built.name}")
    return built


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script (make), where hatchling need not be installed
    BuildHookInterface = object  # type: ignore[assignment,misc]


class LaneBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """hatchling's hook: build the lane, and when it cannot be built, say so and install without it."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        import tempfile
        try:
            with tempfile.TemporaryDirectory() as work:
                built = build(Path(work))
        except Exception as error:  # noqa: BLE001  # any failure: the pure-Python data path, said once
            self.app.display_warning(f"rollout-router: the native HTTP lane was not built ({error}); the router "
                                     "will run its pure-Python data path")
            return
        if version != "editable":
            build_data["force_include"][str(built)] = f"rollout_router/proxy/http/lane/{built.name}"
            frames = GRPC / built.name.replace("_lane", "_grpc_frames", 1)
            build_data["force_include"][str(frames)] = f"rollout_router/proxy/grpc/{frames.name}"
            for name in (*_sources(CORE / "sources.py").COMPILED, "_built"):
                module = CORE / built.name.replace("_lane", name, 1)
                build_data["force_include"][str(module)] = f"rollout_router/core/{module.name}"
            build_data["pure_python"] = False
            build_data["infer_tag"] = True


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as temporary:
        try:
            print(build(Path(temporary)).relative_to(ROOT))
        except Exception as error:  # noqa: BLE001
            print(f"hatch_build.py: the native HTTP lane was not built: {error}", file=sys.stderr)
            sys.exit(1)
