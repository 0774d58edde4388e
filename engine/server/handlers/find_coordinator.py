"""FindCoordinator (API 10, v0-6): this node coordinates every group and transactional id.

Authorization, as Kafka's: a group's coordinator is found with Describe on the group
(else GROUP_AUTHORIZATION_FAILED), a transactional id's with Describe on the id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); v4+ answers each key on its own.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import NODE_ID, Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type

_GROUP_KEY = 0
_TRANSACTION_KEY = 1


def _answer(access: Access, key_type: int, key: str, host: str, port: int) -> dict[str, Any]:
    code, message = ErrorCode.none, None
    if key_type not in (_GROUP_KEY, _TRANSACTION_KEY):
        code, message = (
            ErrorCode.invalid_request,
            f"key type {key_type} is neither a group (0) nor a transaction (1)",
        )
    elif key_type == _GROUP_KEY and not access.group(Operation.DESCRIBE, key):
        code, message = ErrorCode.group_authorization_failed, "the principal may not describe this group"
    elif key_type == _TRANSACTION_KEY and not access.transactional_id(Operation.DESCRIBE, key):
        code, message = (
            ErrorCode.transactional_id_authorization_failed,
            "the principal may not describe this transactional id",
        )
    found = code == ErrorCode.none
    return {
        "error_code": code,
        "error_message": message,
        "node_id": NODE_ID if found else -1,
        "host": host if found else "",
        "port": port if found else -1,
    }


async def handle_find_coordinator(broker: Broker, request: Request) -> Any:
    """This node coordinates every group (key type 0) and transactional id (1); v4+ asks for many keys."""
    body = request.body
    response = response_type(request.api_key, request.api_version)
    host, port = broker.advertised_for(request.session)
    key_type = getattr(body, "key_type", _GROUP_KEY)
    access = broker.access(request)
    if not hasattr(body, "coordinator_keys"):  # v0-3: one key
        return build(response, throttle_time=NO_THROTTLE, **_answer(access, key_type, body.key, host, port))
    coordinator_type = nested(response, "coordinators")
    coordinators = tuple(
        build(coordinator_type, key=key, **_answer(access, key_type, key, host, port))
        for key in body.coordinator_keys
    )
    return build(response, throttle_time=NO_THROTTLE, coordinators=coordinators)
