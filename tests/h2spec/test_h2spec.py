"""h2spec, the HTTP/2 conformance suite, against the router's gRPC listener with a gRPC replica behind it.

Every case must pass; the failures are listed by their h2spec id (e.g. ``http2/6.9.1/2``) with h2spec's own
expected/actual lines, read from its JUnit report.
"""
from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.support import running_router
from tests.test_grpc_proxy import GrpcReplica, backends

from .conftest import binary


def failures(report: Path) -> tuple[int, list[str]]:
    """How many cases ran, and each failed, errored or skipped case as ``id [description]: h2spec's message``."""
    cases, failed = 0, []
    for case in ET.parse(report).getroot().iter("testcase"):
        cases += 1
        problem = next((found for tag in ("failure", "error", "skipped") if (found := case.find(tag)) is not None),
                       None)  # a skipped case did not pass either
        if problem is not None:
            where = case.get("package", "") + " " + case.get("classname", "")
            failed.append(f"{where.strip()} [{case.get('name', '')}]: {(problem.text or problem.get('message') or '').strip()}")
    return cases, failed


async def test_every_h2spec_case_passes_against_the_grpc_listener(tmp_path):
    replica = await GrpcReplica("127.0.0.70").start()
    try:
        async with running_router(backends([replica]), grpc=True) as (_, runtime):
            report = tmp_path / "h2spec.xml"
            process = await asyncio.create_subprocess_exec(
                str(binary()), "-h", "127.0.0.1", "-p", str(runtime.grpc_port), "-o", "5", "-j", str(report),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            output, _ = await process.communicate()
    finally:
        replica.hold.set()
        await replica.stop()
    assert report.exists(), output.decode(errors="replace")[-2000:]
    cases, failed = failures(report)
    assert cases >= 145, f"h2spec ran only {cases} cases"
    assert not failed, f"{len(failed)} of {cases} h2spec cases failed:\n" + "\n".join(failed)
