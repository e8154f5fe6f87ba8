"""kopf handlers: thin glue between events, ``render``, the API and the status poller.

Handlers are registered by ``register`` into a given registry, so the status
interval comes from the command line and tests can build their own operator.
"""
from __future__ import annotations

import asyncio
import logging

import kopf
from kubernetes.client.exceptions import ApiException

from . import kube
from .render import InvalidSpec, child_refs, render
from .spec import GROUP, PLURAL
from .status import collect, invalid


def _retry(error: Exception, retry: int) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(error), delay=min(2 ** retry, 60))


def _apply_all(body: kopf.Body, manifests: list[dict]) -> None:
    """Apply every rendered child, then delete the optional ones no longer rendered (the PDB)."""
    for manifest in manifests:
        kube.apply(manifest)
    rendered = {(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in manifests}
    for ref in child_refs(body["metadata"]["name"]):
        if ref not in rendered:
            kube.delete(*ref[:2], body["metadata"]["namespace"], ref[2])


def register(registry: kopf.OperatorRegistry, status_interval: float) -> None:
    @kopf.on.resume(GROUP, PLURAL, registry=registry)
    @kopf.on.create(GROUP, PLURAL, registry=registry)
    @kopf.on.update(GROUP, PLURAL, field="spec", registry=registry)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, retry: int, logger: logging.Logger, **_: object) -> None:
        generation = body["metadata"].get("generation")
        try:
            manifests = render(dict(body))
        except InvalidSpec as error:
            logger.warning("invalid spec: %s", error)
            patch.status.update(invalid(dict(body.status), generation, str(error)))
            return  # nothing to retry until the spec changes
        try:
            await asyncio.to_thread(_apply_all, body, manifests)
        except kube.RetryableError as error:
            raise _retry(error, retry) from error
        except ApiException as error:
            if error.status != 422:  # 403 and the like: RBAC may be fixed; keep trying, slowly
                raise _retry(error, retry + 4) from error
            message = f"the API rejected a child object: {error.body or error.reason}"
            patch.status.update(invalid(dict(body.status), generation, message))
            return
        patch.status.update(await collect(dict(body), generation))

    @kopf.on.delete(GROUP, PLURAL, registry=registry)
    async def remove(body: kopf.Body, retry: int, **_: object) -> None:
        """Owner references let the garbage collector do this too; deleting here makes it immediate."""
        meta = body["metadata"]
        try:
            for api_version, kind, name in child_refs(meta["name"]):
                await asyncio.to_thread(kube.delete, api_version, kind, meta["namespace"], name)
        except kube.RetryableError as error:
            raise _retry(error, retry) from error

    @kopf.timer(GROUP, PLURAL, interval=status_interval, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, **_: object) -> None:
        """Poll the routers; observedGeneration stays what reconcile last applied."""
        try:
            patch.status.update(await collect(dict(body), body.status.get("observedGeneration")))
        except (kube.RetryableError, ApiException) as error:
            logging.getLogger(__name__).warning("status poll failed, next in %ss: %s", status_interval, error)
