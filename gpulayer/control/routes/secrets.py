"""The secret store: keep, list (names only) and remove secrets. No route returns a value."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, Context
from gpulayer.control.secret_vault import MAX_VALUE_BYTES
from gpulayer.control.views import iso

router = APIRouter(route_class=OffLoopJSONRoute)

SecretName = Annotated[str, PathParam(min_length=1, max_length=128)]


class SecretBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: Annotated[str, Field(min_length=1, max_length=MAX_VALUE_BYTES)]


@router.get("/v1/secrets", dependencies=ADMIN)
def list_secrets(context: Context) -> list[dict[str, Any]]:
    return [
        {**row, "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
        for row in context.service.secrets.listing()
    ]


@router.put("/v1/secrets/{name}", dependencies=ADMIN)
def put_secret(
    name: SecretName, body: SecretBody, context: Context, response: Response
) -> dict[str, Any]:
    created = context.service.secrets.put(name, body.value)
    response.status_code = 201 if created else 200
    return {"name": name, "created": created}


@router.delete("/v1/secrets/{name}", dependencies=ADMIN)
def delete_secret(name: SecretName, context: Context) -> dict[str, Any]:
    context.service.secrets.remove(name)
    return {"name": name, "removed": True}
