"""verl's environment with the router in it, as `make install-test` builds it for tests/test_verl_install.py.

``resolve``: pip resolves verl 0.9.1 with its vLLM pins (``verl[vllm]``: torch, vLLM, transformers) together with
the router's own requirements, from the package index's metadata, installing nothing; the report and pip's exit
status and error are kept. ``constraints``: the versions that resolution chose, as a pip constraints file, so the
test's small environment holds the router at exactly the versions a verl node would (without the GPU stack,
which the plugin does not import).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

VERL = "verl[vllm]==0.9.1"
SKIP = {"rollout-router", "verl"}  # installed from the checkout and without dependencies


def resolve(pip: str, project: str, out: Path) -> int:
    """Run the resolution; write ``out`` (pip's report) and ``out``.status.json (exit code, pip's last lines)."""
    done = subprocess.run([pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(out),
                           VERL, project], capture_output=True, text=True)
    status = {"requirements": [VERL, project], "returncode": done.returncode,
              "stderr": done.stderr.strip().splitlines()[-20:]}
    out.with_suffix(".status.json").write_text(json.dumps(status, indent=1))
    return 0


def constraints(report: Path) -> str:
    """``name==version`` for every package the resolution chose, but the router and verl."""
    chosen = json.loads(report.read_text())["install"]
    return "".join(f"{item['metadata']['name']}=={item['metadata']['version']}\n" for item in chosen
                   if item["metadata"]["name"].lower() not in SKIP)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "resolve":
        sys.exit(resolve(rest[0], rest[1], Path(rest[2])))
    print(constraints(Path(rest[0])), end="")
