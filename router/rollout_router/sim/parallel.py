"""Run independent simulation tasks on local worker processes or on a Ray cluster.

A task is a picklable argument to a module-level function; its result depends on
the argument alone (every draw is seeded by the task), so which executor runs it,
in what order, on how many workers, never changes a number. Results come back
in task order.

``ray_address`` is passed to ``ray.init``: ``"local"`` starts a private local
instance, ``"auto"`` joins the cluster this machine belongs to, ``host:port`` a
running one (``ray start --head`` prints it). Except for a private local
instance, the package's source is shipped to the workers
(``runtime_env.py_modules``), so workers elsewhere need only Python and numpy.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


Done = Callable[[int, Any], None]  # (task index, result), called as each result arrives


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T], jobs: int = 1, ray_address: str | None = None,
              progress: bool = True, desc: str = "simulating", on_result: Done | None = None) -> list[R]:
    """``[fn(t) for t in tasks]``, spread over ``jobs`` local processes or a Ray cluster.

    ``on_result`` sees every result as soon as it is in (to save it before the others finish).
    """
    bar = _progress(len(tasks), progress, desc)
    results: list[Any] = [None] * len(tasks)

    def done(i: int, result: Any) -> None:
        results[i] = result
        if on_result is not None:
            on_result(i, result)
        bar.update(1)

    try:
        if ray_address:
            _on_ray(fn, tasks, ray_address, done)
        elif jobs <= 1 or len(tasks) <= 1:
            for i, t in enumerate(tasks):
                done(i, fn(t))
        else:
            _on_processes(fn, tasks, jobs, done)
    finally:
        bar.close()
    return results


def _on_processes(fn: Callable[[T], R], tasks: Sequence[T], jobs: int, done: Done) -> None:
    with ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())


def _on_ray(fn: Callable[[T], R], tasks: Sequence[T], address: str, done: Done) -> None:
    try:
        import ray
    except ImportError:
        raise SystemExit("--ray-address needs Ray on this machine: pip install 'ray>=2.41'") from None

    started = not ray.is_initialized()
    if started:
        start_ray(**_ray_init_args(address))
    try:
        remote = ray.remote(num_cpus=1, max_retries=2)(fn)
        index = {ref: i for i, ref in enumerate(remote.remote(t) for t in tasks)}
        pending = list(index)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=30.0)
            for ref in ready:
                done(index[ref], ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def start_ray(**init_args: Any) -> None:
    """``ray.init``, with one more try when it starts a local instance that misses Ray's start-up wait.

    Ray gives a new local node's raylet a fixed 30 s to register with its GCS and then raises
    (``ray/_private/node.py``; ray-project/ray#62883); on a loaded machine that happens now and then, and
    a second start, after the first is shut down, comes up. Joining a running cluster is not retried.
    """
    import ray

    local = init_args.get("address") in (None, "local")
    for attempt in (1, 2):
        try:
            ray.init(**init_args)
            return
        except Exception as error:  # Ray raises a bare Exception for this
            if not local or attempt == 2 or "timed out during startup" not in str(error):
                raise
            ray.shutdown()


def _ray_init_args(address: str) -> dict[str, Any]:
    """``ray.init`` arguments: a private local instance, or a cluster that gets this package's source."""
    args: dict[str, Any] = {"address": address, "logging_level": "WARNING", "log_to_driver": False}
    if address == "local":
        args.update(num_cpus=os.cpu_count() or 1, include_dashboard=False)
    else:
        import rollout_router

        args["runtime_env"] = {"py_modules": [os.path.dirname(rollout_router.__file__)]}
    return args


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the [sim] extra
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, mininterval=1.0 if sys.stderr.isatty() else 15.0)
