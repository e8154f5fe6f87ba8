"""kopf handlers: thin glue between events, ``render``, the API and the status poller.

Handlers are registered by ``register`` into a given registry, so the status
interval and the default router image come from the command line and tests can
build their own operator. Counting happens in ``metrics``.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from rollout_router.kube.client import ApiError

from . import kube, metrics
from .render import InvalidSpec, child_refs, render
from .spec import GROUP, PLURAL
from .status import collect, invalid


def _retry(error: Exception, retry: int) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(error), delay=min(2 ** retry, 60))


async def _apply_all(body: kopf.Body, manifests: list[dict]) -> None:
    """Apply every rendered child, then delete the optional ones no longer rendered (the PDB)."""
    for manifest in manifests:
        await kube.apply(manifest)
    rendered = {(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in manifests}
    for ref in child_refs(body["metadata"]["name"]):
        if ref not in rendered:
            await kube.delete(*ref[:2], body["metadata"]["namespace"], ref[2])


async def _apply_or_reject(body: kopf.Body, manifests: list[dict], retry: int) -> str | None:
    """Apply the children; the API's message when it rejects one (422: retrying cannot help)."""
    try:
        await _apply_all(body, manifests)
    except kube.RetryableError as error:
        raise _retry(error, retry) from error
    except ApiError as error:
        if error.status != 422:  # 403 and the like: RBAC may be fixed; keep trying, slowly
            raise _retry(error, retry + 4) from error
        return f"the API rejected a child object: {error.message}"
    return None


def _write_status(patch: kopf.Patch, meta: Mapping[str, Any], document: dict) -> None:
    """Patch the status and let the metrics see what was written."""
    patch.status.update(document)
    metrics.status_written(meta["namespace"], meta["name"], document)


def register(registry: kopf.OperatorRegistry, status_interval: float, router_image: str) -> None:
    """Handlers into ``registry``; ``router_image`` is the image of routers whose spec names none."""
    @kopf.on.resume(GROUP, PLURAL, registry=registry)
    @kopf.on.create(GROUP, PLURAL, registry=registry)
    @kopf.on.update(GROUP, PLURAL, field="spec", registry=registry)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, retry: int, reason: str,
                        logger: logging.Logger | logging.LoggerAdapter[Any], **_: object) -> None:
        generation = body["metadata"].get("generation")
        with metrics.reconcile(kopf.Reason(reason).value) as run:
            try:
                problem = await _apply_or_reject(body, render(dict(body), default_image=router_image), retry)
            except InvalidSpec as error:
                problem = str(error)
            if problem:  # reported, not retried: nothing changes until the spec does
                logger.warning("invalid spec: %s", problem)
                run.outcome = metrics.INVALID_SPEC
                document = invalid(dict(body.status), generation, problem)
            else:
                document = await collect(dict(body), generation)
            _write_status(patch, body["metadata"], document)

    @kopf.on.delete(GROUP, PLURAL, registry=registry)
    async def remove(body: kopf.Body, retry: int, **_: object) -> None:
        """Owner references let the garbage collector do this too; deleting here makes it immediate."""
        meta = body["metadata"]
        with metrics.reconcile("delete"):
            try:
                for api_version, kind, name in child_refs(meta["name"]):
                    await kube.delete(api_version, kind, meta["namespace"], name)
            except kube.RetryableError as error:
                raise _retry(error, retry) from error
        metrics.forget(meta["namespace"], meta["name"])

    @kopf.timer(GROUP, PLURAL, interval=status_interval, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, **_: object) -> None:
        """Poll the routers; observedGeneration stays what reconcile last applied."""
        try:
            document = await collect(dict(body), body.status.get("observedGeneration"))
        except (kube.RetryableError, ApiError) as error:
            metrics.status_poll_failed()
            logging.getLogger(__name__).warning("status poll failed, next in %ss: %s", status_interval, error)
            return
        _write_status(patch, body["metadata"], document)
