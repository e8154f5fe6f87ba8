"""kopf handlers: thin glue between events, ``render``, the API and the status poller.

Handlers are registered by ``register`` into a given registry, so the status
interval and the default router image come from the command line and tests can
build their own operator. Counting happens in ``metrics``.

The status is written by ``kube.patch_status``, not through kopf's ``patch``:
kopf does not retry a 409 on its own patch, and a timer whose patch fails once
never runs again. A handler that cannot write raises ``TemporaryError`` (kopf
retries it); the timer logs and tries again at its next tick.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from rollout_router.kube.client import ApiError
from rollout_router.kube.resources import UnknownKind

from . import kube, metrics
from .render import InvalidSpec, child_refs, render
from .spec import GROUP, PLURAL
from .status import collect, invalid, rejected

# Status intervals between looks for a kind the API does not serve (a minute at the default 10 s): kopf logs
# and posts an Event for every try, so not every interval.
MISSING_KIND_RECHECK = 6


def _poll_failed(logger: logging.Logger | logging.LoggerAdapter[Any], error: Exception, interval: float) -> None:
    """Reading the routers' state failed: counted and said in one line; the status timer tries again."""
    metrics.status_poll_failed()
    logger.warning("status poll failed, the status timer tries again within %gs: %s", interval, error)


def _retry(error: Exception, retry: int) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(error), delay=min(2 ** retry, 60))


async def _delete_child(namespace: str, ref: tuple[str, str, str]) -> None:
    """Delete a child by name; one the API refuses to delete (403) is left alone and logged.

    The operator never reads before it deletes, so a refusal is how it learns that the object of that name
    is not its own (the chart's admission policy refuses deleting what the operator does not manage, e.g. a
    user's ServiceMonitor named ``<name>-router``) or that its RBAC lacks the kind. Neither gets better by
    retrying, and its own children also go with the resource, by their ownerReferences."""
    try:
        await kube.delete(ref[0], ref[1], namespace, ref[2])
    except ApiError as error:
        if error.status != 403:
            raise
        logging.getLogger(__name__).warning("left %s %s/%s alone: %s", ref[1], namespace, ref[2], error.message)


async def _apply_all(body: kopf.Body, manifests: list[dict]) -> None:
    """Apply every rendered child, then delete the optional ones no longer rendered (the PDB)."""
    for manifest in manifests:
        await kube.apply(manifest)
    rendered = {(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in manifests}
    for ref in child_refs(body["metadata"]["name"]):
        if ref not in rendered:
            await _delete_child(body["metadata"]["namespace"], ref)


async def _apply_or_reject(body: kopf.Body, manifests: list[dict], retry: int) -> str | None:
    """Apply the children; the API's message when it rejects one (422: retrying cannot help)."""
    try:
        await _apply_all(body, manifests)
    except kube.RetryableError as error:
        raise _retry(error, retry) from error
    except UnknownKind:
        raise  # the reconcile reports it and looks again
    except ApiError as error:
        if error.status != 422:  # 403 and the like: RBAC may be fixed; keep trying, slowly
            raise _retry(error, retry + 4) from error
        return f"the API rejected a child object: {error.message}"
    return None


def _status_lock(memo: kopf.Memo) -> asyncio.Lock:
    """One resource's status writers (reconcile, the timer) take turns, so an older document never
    lands after a newer one (observedGeneration going back, the timer hiding an InvalidSpec)."""
    lock: asyncio.Lock = memo.setdefault("status_lock", asyncio.Lock())
    return lock


def _status(body: kopf.Body, memo: kopf.Memo) -> dict:
    """The resource's status as this operator last wrote it (``memo``), else as the body has it (``{}`` when it
    is null or missing: a new resource). A reconcile's body can be older than what the timer wrote while it
    waited for the lock; computed from it, the status would undo that write (and the ledger lose counts)."""
    written = memo.get("status")
    return dict(written) if written is not None else dict(body.get("status") or {})


async def _write_status(meta: Mapping[str, Any], previous: dict, document: dict, memo: kopf.Memo) -> None:
    """Patch the status (a merge patch over ``previous``), remember what it is now, let the metrics see it."""
    stored = await kube.patch_status(meta["namespace"], meta["name"], document)
    # As the API server answered it; else as the merge leaves it (each top-level field is written whole).
    memo["status"] = stored if stored is not None else {**previous, **document}
    metrics.status_written(meta["namespace"], meta["name"], document)


def register(registry: kopf.OperatorRegistry, status_interval: float, router_image: str,
             allowed_images: Sequence[str] = (), token_key: bytes | None = None) -> None:
    """Handlers into ``registry``; ``router_image`` is the image of routers whose spec names none,
    ``allowed_images`` the patterns a spec's image must match (empty: any), ``token_key`` the key the
    routers' admin tokens are derived from (``render.admin_token``; None: no tokens)."""
    @kopf.on.resume(GROUP, PLURAL, registry=registry)
    @kopf.on.create(GROUP, PLURAL, registry=registry)
    @kopf.on.update(GROUP, PLURAL, field="spec", registry=registry)
    async def reconcile(body: kopf.Body, retry: int, reason: str, memo: kopf.Memo,
                        logger: logging.Logger | logging.LoggerAdapter[Any], **_: object) -> None:
        async with _status_lock(memo):
            generation, problem, missing_kind = await _reconcile(body, retry, reason, logger, memo)
            memo["observed"] = generation, not problem
        if missing_kind:  # reported, and looked for again: installing the CRD later heals the resource by itself
            raise kopf.TemporaryError(problem, delay=status_interval * MISSING_KIND_RECHECK)

    async def _reconcile(body: kopf.Body, retry: int, reason: str, logger: logging.Logger | logging.LoggerAdapter[Any],
                         memo: kopf.Memo) -> tuple[int | None, str | None, bool]:
        """Apply the children and write the status: the generation observed, the problem that made it invalid
        (or None), and whether that problem is a kind the API does not serve (a CRD not installed yet)."""
        generation = body["metadata"].get("generation")
        previous = _status(body, memo)
        missing_kind = False
        with metrics.reconcile(kopf.Reason(reason).value) as run:
            try:
                problem = await _apply_or_reject(body, render(dict(body), router_image, allowed_images, token_key),
                                                retry)
            except InvalidSpec as error:
                problem = str(error)
            except UnknownKind as error:  # e.g. spec.serviceMonitor without the Prometheus Operator's CRDs
                problem = f"{error.message}: install its CustomResourceDefinition, or turn off the spec field that " \
                          "renders it"
                missing_kind = True
            if problem:  # reported; retried only for a missing kind, else nothing changes until the spec does
                logger.warning("invalid spec: %s", problem)
                run.outcome = metrics.INVALID_SPEC
                document = invalid(previous, generation, problem)
            else:
                try:
                    document = await collect(dict(body), previous, generation, token_key)
                except (kube.RetryableError, ApiError) as error:  # e.g. 403 listing pods: the children stand
                    _poll_failed(logger, error, status_interval)
                    return generation, None, False  # the status timer reads the routers again
        try:  # after the run is counted: a failed write retries the handler, which counts again
            await _write_status(body["metadata"], previous, document, memo)
        except kube.RetryableError as error:
            raise _retry(error, retry) from error
        return generation, problem, missing_kind

    @kopf.on.delete(GROUP, PLURAL, registry=registry)
    async def remove(body: kopf.Body, retry: int, memo: kopf.Memo, **_: object) -> None:
        """Owner references let the garbage collector do this too; deleting here makes it immediate.

        A child that fails is passed over and retried later; the ones already gone are remembered
        in ``memo``, so a retry deletes only what is left instead of starting the list again.
        """
        meta = body["metadata"]
        gone: set[tuple[str, str, str]] = memo.setdefault("deleted_children", set())
        with metrics.reconcile("delete"):
            failed: list[kube.RetryableError] = []
            for ref in child_refs(meta["name"]):
                if ref not in gone:
                    try:
                        await _delete_child(meta["namespace"], ref)
                        gone.add(ref)
                    except kube.RetryableError as error:
                        failed.append(error)
            if failed:
                raise _retry(failed[0], retry)
        metrics.forget(meta["namespace"], meta["name"])

    @kopf.timer(GROUP, PLURAL, interval=status_interval, registry=registry)
    async def refresh(body: kopf.Body, memo: kopf.Memo, **_: object) -> None:
        """Poll the routers; observedGeneration stays what reconcile last applied. Never raises on
        an API error: the next tick tries again, whatever the API answered this time."""
        async with _status_lock(memo):  # never a document computed before a reconcile written after it
            status = _status(body, memo)  # after a restart, before the resume handler ran: as last written
            generation, valid = memo.get("observed") or (status.get("observedGeneration"),
                                                         not rejected(status, body["metadata"].get("generation")))
            if not valid:
                return  # reconcile found this generation invalid: nothing runs, and its message stays
            try:
                await _write_status(body["metadata"], status,
                                    await collect(dict(body), status, generation, token_key), memo)
            except (kube.RetryableError, ApiError) as error:
                _poll_failed(logging.getLogger(__name__), error, status_interval)
