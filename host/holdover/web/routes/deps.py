"""What every route needs from the app: the bridge, and the bearer token check for actions."""

from __future__ import annotations

import secrets

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from holdover.bridge.service import Bridge

_bearer = HTTPBearer(auto_error=False)


def bridge(request: Request) -> Bridge:
    return request.app.state.bridge


def token(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """Actions change things (a relay, a checkpoint, a message to phones): a token, always."""
    want = request.app.state.settings.token_value()
    if not want:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "actions are off: no [web] token is configured")
    if cred is None or not secrets.compare_digest(cred.credentials.encode(), want.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "a valid bearer token is needed", headers={"WWW-Authenticate": "Bearer"}
        )
