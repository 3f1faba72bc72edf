"""API tokens: list, create (shown once) and revoke them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from gpulayer.control.idempotency import HEADER as IDEMPOTENCY_HEADER
from gpulayer.control.idempotency import TokenShownOnce
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, Context, once_key
from gpulayer.control.store.once_keys import KeyTaken, OnceKey
from gpulayer.control.views import token_view
from gpulayer.protocol.messages import TokenRequest

router = APIRouter(route_class=OffLoopJSONRoute)


@router.get("/v1/tokens", dependencies=ADMIN)
def list_tokens(context: Context, all_kinds: bool = False) -> list[dict[str, Any]]:
    kinds = None if all_kinds else ["admin", "join"]
    return [token_view(record) for record in context.service.tokens.listed(kinds)]


@router.post("/v1/tokens/{token_id}/revoke", dependencies=ADMIN)
def revoke_token(token_id: str, context: Context) -> dict[str, Any]:
    return {"id": token_id, "revoked": context.service.tokens.revoke(token_id)}


@router.post("/v1/tokens", dependencies=ADMIN)
def create_token(
    body: TokenRequest, context: Context, once: OnceKey | None = Depends(once_key)
) -> dict[str, Any]:
    answers = context.answers
    made = answers.prior(once)
    if made is None:
        try:
            token = context.service.tokens.create(
                body.kind,
                body.name,
                expires_at=body.expires_at,
                max_workers=body.max_workers,
                once=once,
            )
        except KeyTaken:
            made = answers.prior(once)
            if made is None:
                raise
        else:
            return {"token": token, "kind": body.kind}
    # A token's value is shown once and never kept, so a resent request cannot be
    # answered with it: it is told which token its first send made instead.
    raise TokenShownOnce(
        f"{IDEMPOTENCY_HEADER}: this request made token {made[0]} already, whose value "
        f"is shown only once; revoke it (gpulayer token revoke {made[0]}) and create another"
    )
