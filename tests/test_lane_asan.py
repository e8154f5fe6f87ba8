"""The native lane is C that reads bytes from any client and any replica: built with AddressSanitizer and
UndefinedBehaviorSanitizer, it reads thousands of mutated requests and answers (tests/tools/lane_fuzz.py) without
one access out of bounds, use after free or undefined operation, and ends with nothing held."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # hatch_build.py, the lane's build
from hatch_build import build  # noqa: E402

SANITIZERS = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all")


def runtime_library(compiler: str) -> str | None:
    """The ASan runtime the sanitizers' build needs preloaded into an interpreter built without it."""
    found = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.mark.timeout(400)  # a build with the sanitizers (~20 s), then ~35 s of hostile cases on 2 busy cores
def test_the_lane_reads_hostile_bytes_within_its_buffers(tmp_path):
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: no lane to check")
    asan = runtime_library(compiler)
    if asan is None:
        pytest.skip(f"{compiler} has no AddressSanitizer runtime here (libasan)")
    module = build(tmp_path / "work", tmp_path / "built", SANITIZERS)
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "lane_fuzz.py"), str(module),
                          "--cases", "1000"], capture_output=True, text=True, timeout=360,
                         env={**os.environ, "LD_PRELOAD": asan, "PYTHONMALLOC": "malloc",
                              "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
                              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
    assert "lane_fuzz:" in run.stdout and "ERROR: AddressSanitizer" not in run.stderr
