"""SaslHandshake (API 17, v0-1) and SaslAuthenticate (API 36, v0-2): a SASL listener's login.

The state table is in oncelog.server.sasl. v0 of SaslHandshake means raw SASL tokens
follow outside Kafka's framing (before KIP-152); no client this project supports sends
it, so it is answered UNSUPPORTED_VERSION and the connection closed.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.server.broker import Broker
from oncelog.server.codec import Request, build, response_type
from oncelog.server.credentials import PLAIN, SCRAM_MECHANISMS
from oncelog.server.sasl import (
    MAX_SASL_TOKEN_BYTES,
    SaslAuthenticationError,
    ScramLogin,
    Session,
    plain_login,
)

log = logging.getLogger("oncelog.server")
_NO_REAUTHENTICATION = datetime.timedelta(0)


def _session(request: Request) -> Session:
    session = request.session
    assert isinstance(session, Session), "every served request carries its connection's session"
    return session


async def handle_sasl_handshake(broker: Broker, request: Request) -> Any:
    session = _session(request)
    response = response_type(request.api_key, request.api_version)
    enabled = broker.config.sasl_mechanisms if session.listener.uses_sasl else ()
    mechanism = request.body.mechanism
    if not session.listener.uses_sasl or session.authenticated or session.mechanism is not None:
        code = ErrorCode.illegal_sasl_state
    elif request.api_version == 0:
        code = ErrorCode.unsupported_version
    elif mechanism not in enabled:
        code = ErrorCode.unsupported_sasl_mechanism
    else:
        session.mechanism = mechanism
        return build(response, error_code=ErrorCode.none, mechanisms=tuple(enabled))
    session.close_after_response = True
    broker.warnings.warning(
        ("sasl", request.client_host),
        "SaslHandshake for %r from %s on %s: %s; closing",
        mechanism,
        request.client_host,
        session.listener.name,
        code.name,
    )
    return build(response, error_code=code, mechanisms=tuple(enabled))


async def handle_sasl_authenticate(broker: Broker, request: Request) -> Any:
    session = _session(request)
    response = response_type(request.api_key, request.api_version)
    extra = {"session_lifetime": _NO_REAUTHENTICATION} if request.api_version >= 1 else {}
    if session.authenticated or session.mechanism is None:
        session.close_after_response = True
        message = "SaslAuthenticate is answered only after a SaslHandshake, once per connection"
        return build(
            response, error_code=ErrorCode.illegal_sasl_state, error_message=message, auth_bytes=b"", **extra
        )
    token: bytes = request.body.auth_bytes
    try:
        if len(token) > MAX_SASL_TOKEN_BYTES:  # never parsed: see MAX_SASL_TOKEN_BYTES
            raise SaslAuthenticationError(f"Authentication failed: a {len(token)}-byte SASL token")
        challenge, done, user = await _step(broker, session, token)
    except SaslAuthenticationError as exc:
        session.close_after_response = True
        broker.warnings.warning(
            ("sasl-failed", request.client_host),
            "SASL %s login from %s failed; closing after %d ms",
            session.mechanism,
            request.client_host,
            broker.config.failed_authentication_delay_ms,
        )
        # The same delay whatever failed: a guesser learns nothing from timing, and slowly.
        await asyncio.sleep(broker.config.failed_authentication_delay_ms / 1000)
        return build(
            response,
            error_code=ErrorCode.sasl_authentication_failed,
            error_message=str(exc),
            auth_bytes=b"",
            **extra,
        )
    if done:
        assert user is not None
        session.logged_in(user)
        log.info("%s logged in from %s with %s", session.principal, request.client_host, session.mechanism)
    return build(response, error_code=ErrorCode.none, error_message=None, auth_bytes=challenge, **extra)


async def _step(broker: Broker, session: Session, token: bytes) -> tuple[bytes, bool, str | None]:
    """The mechanism's answer to `token`, whether the login is done, and the user once it is."""
    if session.mechanism == PLAIN:
        # Salting and iterating the password takes milliseconds: off the event loop.
        user = await broker.in_login_thread(lambda: plain_login(token, broker.credentials))
        return b"", True, user
    assert session.mechanism in SCRAM_MECHANISMS, session.mechanism
    if session.scram is None:
        session.scram = ScramLogin(session.mechanism, broker.credentials)
    scram = session.scram
    challenge, done = await broker.in_login_thread(lambda: scram.step(token))
    return challenge, done, scram.user if done else None
