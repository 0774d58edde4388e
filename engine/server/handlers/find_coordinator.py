"""FindCoordinator (API 10, v0-6): this node coordinates every group and transactional id."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.server.broker import NODE_ID, Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type

_GROUP_KEY = 0
_TRANSACTION_KEY = 1


async def handle_find_coordinator(broker: Broker, request: Request) -> Any:
    """This node coordinates every group (key type 0) and transactional id (1); v4+ asks for many keys."""
    body = request.body
    response = response_type(request.api_key, request.api_version)
    host, port = broker.advertised_for(request.session)
    key_type = getattr(body, "key_type", _GROUP_KEY)
    code = ErrorCode.none if key_type in (_GROUP_KEY, _TRANSACTION_KEY) else ErrorCode.invalid_request
    message = (
        None
        if code == ErrorCode.none
        else f"key type {key_type} is neither a group (0) nor a transaction (1)"
    )
    found = {
        "error_code": code,
        "error_message": message,
        "node_id": NODE_ID if code == ErrorCode.none else -1,
        "host": host if code == ErrorCode.none else "",
        "port": port if code == ErrorCode.none else -1,
    }
    if not hasattr(body, "coordinator_keys"):  # v0-3: one key
        return build(response, throttle_time=NO_THROTTLE, **found)
    coordinator_type = nested(response, "coordinators")
    coordinators = tuple(build(coordinator_type, key=key, **found) for key in body.coordinator_keys)
    return build(response, throttle_time=NO_THROTTLE, coordinators=coordinators)
