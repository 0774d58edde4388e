"""A connection's security state, and its SASL login (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).

On a SASL listener a connection is served nothing but ApiVersions, SaslHandshake and
SaslAuthenticate until its login succeeds, as Kafka's SaslServerAuthenticator does:

- handshake, SaslHandshake v1 of an enabled mechanism: none, and the enabled ones;
  the connection moves to authenticate.
- handshake, SaslHandshake of another mechanism (UNSUPPORTED_SASL_MECHANISM) or v0
  (UNSUPPORTED_VERSION): answered, then closed.
- authenticate, SaslAuthenticate: the mechanism's next challenge; after the last step
  the connection is authenticated.
- authenticate, a wrong password, an unknown user or a malformed token:
  SASL_AUTHENTICATION_FAILED after `failed_authentication_delay_ms`, then closed.
- handshake or authenticate, any other API: closed, nothing answered.
- authenticated, SaslHandshake or SaslAuthenticate: ILLEGAL_SASL_STATE, then closed
  (no re-authentication).

Before the login completes a frame may be at most MAX_UNAUTHENTICATED_FRAME_BYTES
(Kafka's sasl.server.max.receive.size), so a peer with no password cannot make the
server read 100 MB. A failed login gets the same answer, after the same delay, whether
the user exists or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import scramp

from oncelog.server.credentials import CredentialStore, stand_in_credential
from oncelog.server.listeners import Listener
from oncelog.server.tls import ANONYMOUS

# Kafka's sasl.server.max.receive.size: the largest frame read before a login completes.
MAX_UNAUTHENTICATED_FRAME_BYTES: Final = 512 * 1024
# The largest SASL token looked at: a SCRAM message or a PLAIN login is a few hundred bytes,
# and scramp and SASLprep parse in Python (a 500 KB token took a second of the CPU).
MAX_SASL_TOKEN_BYTES: Final = 4096


class SaslAuthenticationError(Exception):
    """A login that failed: the message goes to the client (it never says which part was wrong)."""


def _sasl_name(text: str) -> str:
    """A SCRAM user name as RFC 5802 writes it (`=2C` for a comma, `=3D` for `=`), decoded."""
    return text.replace("=2C", ",").replace("=3D", "=")


class ScramLogin:
    """The server's half of a SCRAM exchange: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: str, credentials: CredentialStore):
        self.user: str | None = None

        def auth_info(user: str) -> tuple[bytes, bytes, bytes, int]:
            name = _sasl_name(user)
            credential = credentials.scram(name, mechanism)
            if credential is None:
                # A challenge like any other, which no proof answers: the login fails at the
                # last step, as a wrong password does, and says nothing of who exists.
                return stand_in_credential(name, mechanism).as_auth_info()
            self.user = name
            return credential.as_auth_info()

        self._server = scramp.ScramMechanism(mechanism).make_server(auth_info)
        self._steps = 0

    def step(self, token: bytes) -> tuple[bytes, bool]:
        """The answer to the client's next message, and whether the login is complete."""
        self._steps += 1
        try:
            message = token.decode("utf-8")
            if self._steps == 1:
                self._server.set_client_first(message)
                return self._server.get_server_first().encode("utf-8"), False
            if self._steps == 2:
                self._server.set_client_final(message)
                return self._server.get_server_final().encode("utf-8"), True
        except (UnicodeDecodeError, scramp.ScramException) as exc:
            raise SaslAuthenticationError(
                "Authentication failed due to invalid credentials with SASL mechanism SCRAM"
            ) from exc
        raise SaslAuthenticationError("Authentication failed: a SCRAM login has two steps")


def plain_login(token: bytes, credentials: CredentialStore) -> str:
    """The user a PLAIN token (authzid NUL authcid NUL password, RFC 4616) logs in; slow (it
    salts and iterates the password): run it off the event loop."""
    parts = token.split(b"\0")
    try:
        authzid, user, password = (
            (part.decode("utf-8") for part in parts) if len(parts) == 3 else ("", "", "")
        )
    except UnicodeDecodeError:
        user = ""
    if not user or (authzid and authzid != user):
        raise SaslAuthenticationError(
            "Authentication failed: invalid PLAIN token, or an authorization id that is not the user name"
        )
    if not credentials.check_plain(user, password):
        raise SaslAuthenticationError("Authentication failed: Invalid username or password")
    return user


@dataclass
class Session:
    """What a connection has shown of itself: the listener it came in on, and who it is."""

    listener: Listener
    principal: str = ANONYMOUS
    # False on a SASL listener until the login completes.
    authenticated: bool = True
    mechanism: str | None = None
    scram: ScramLogin | None = field(default=None, repr=False)
    # Set by a handler whose answer ends the connection (a failed login, a SASL state error).
    close_after_response: bool = False

    @classmethod
    def for_listener(cls, listener: Listener, principal: str = ANONYMOUS) -> Session:
        return cls(listener, principal, authenticated=not listener.uses_sasl)

    def logged_in(self, user: str) -> None:
        self.principal = f"User:{user}"
        self.authenticated = True
        self.scram = None
