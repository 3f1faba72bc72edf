"""Code bundles a client uploads once, kept by their digest for every job that names it."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from gpulayer.control.bundle_store import DIGEST_PREFIX, parse_digest
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, ARCHIVE_BODY, Context
from gpulayer.control.uploads import receive_to_file
from gpulayer.errors import NotFoundError

router = APIRouter(route_class=OffLoopJSONRoute)


@router.put("/v1/bundles", dependencies=ADMIN, openapi_extra=ARCHIVE_BODY)
async def upload_bundle(request: Request, context: Context) -> dict[str, Any]:
    from gpulayer.protocol.bundle import check_archive

    service = context.service
    out = await receive_to_file(request.stream(), service.layout.root / "incoming", ".tar.gz")
    try:
        await asyncio.to_thread(check_archive, out)
    except Exception:
        out.unlink(missing_ok=True)  # refused whole: nothing is kept of it
        raise
    digest = await asyncio.to_thread(service.bundles.keep, out)
    return {"bundle_id": f"{DIGEST_PREFIX}{digest}"}


@router.get("/v1/bundles/{bundle_id}", dependencies=ADMIN)
def find_bundle(bundle_id: str, context: Context) -> dict[str, Any]:
    """Whether the server keeps this bundle already (so a submit need not upload it)."""
    digest = parse_digest(bundle_id)
    if digest is None or not context.service.bundles.has(digest):
        raise NotFoundError(f"bundle {bundle_id} is not kept here")
    return {"bundle_id": f"{DIGEST_PREFIX}{digest}"}
