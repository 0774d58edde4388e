"""The SASL users of a root, as SCRAM keeps them: salted, iterated, no password on disk.

`ROOT/security.lmdb` holds one record per user, `user/<name>`: for each SCRAM mechanism
the user has, the salt, the iteration count, and the two keys SCRAM derives from the
salted password (StoredKey, which checks a client's proof, and ServerKey, which signs
the server's answer). Neither gives the password back. PLAIN logins check against the
same record: the password is salted and iterated as the record says and must give its
StoredKey. SCRAM's arithmetic is `scramp`'s.

The store is the server user's alone (`security_store`), and holds the ACLs too.
Every read goes to the store, so `oncelog users` and AlterUserScramCredentials take
effect on the next login, in every process serving the root.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import scramp
from scramp.core import _c_key_stored_key_s_key  # SaltedPassword -> keys, as scramp derives them

from oncelog.server.security_store import open_security_store
from oncelog.storage.fs import FileSystem, MetadataStore
from oncelog.storage.metadata_values import committing

USER_PREFIX: Final = "user/"
SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
PLAIN: Final = "PLAIN"
SASL_MECHANISMS: Final = (PLAIN, *SCRAM_MECHANISMS)
# Kafka's bounds on a SCRAM credential's iterations (ScramMechanism.minIterations/maxIterations).
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
DEFAULT_ITERATIONS: Final = 8192
# What scramp's server takes (RFC 5802 sets no bound; a short salt defeats its purpose).
MIN_SALT_BYTES: Final = 12
# An LMDB key holds 511 bytes; Kafka's own limit on a SCRAM user name is far above any real one.
MAX_USER_NAME_BYTES: Final = 256


class CredentialError(ValueError):
    """A user name, mechanism or iteration count the store does not take."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def as_auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What scramp's server asks its auth function for."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def check_user_name(name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CredentialError(f"a user name is UTF-8 text, got {name!r}") from None
    if not name or len(name.encode("utf-8")) > MAX_USER_NAME_BYTES:
        raise CredentialError(
            f"a user name is 1..{MAX_USER_NAME_BYTES} bytes of UTF-8, got {len(name)} characters"
        )


def check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")


def _hash_function(mechanism: str) -> Any:
    if mechanism not in SCRAM_MECHANISMS:
        raise CredentialError(f"mechanism must be one of {', '.join(SCRAM_MECHANISMS)}, got {mechanism!r}")
    return scramp.ScramMechanism(mechanism).hf


def credential_from_password(
    mechanism: str, password: str, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    check_iterations(iterations)
    _hash_function(mechanism)
    try:
        salt_out, stored_key, server_key, count = scramp.ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
    except scramp.ScramException as exc:  # SASLprep refuses control characters, say
        raise CredentialError(f"the password cannot be used: {exc}") from exc
    return ScramCredential(bytes(salt_out), bytes(stored_key), bytes(server_key), int(count))


def credential_from_salted(
    mechanism: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """What AlterUserScramCredentials sends (the client salts and iterates) as a credential."""
    check_iterations(iterations)
    if len(salt) < MIN_SALT_BYTES:
        raise CredentialError(f"a salt is at least {MIN_SALT_BYTES} bytes, got {len(salt)}")
    _, stored_key, server_key = _c_key_stored_key_s_key(_hash_function(mechanism), salted_password)
    return ScramCredential(salt, bytes(stored_key), bytes(server_key), iterations)


# Stand-in salts for users that do not exist: the same for a name within a process, so a
# SCRAM login as an unknown user gets a challenge that looks like any other.
_STAND_IN_KEY: Final = secrets.token_bytes(32)


def stand_in_salt(name: str) -> bytes:
    return hmac.new(_STAND_IN_KEY, name.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()[:16]


def stand_in_credential(name: str, mechanism: str) -> ScramCredential:
    """What a SCRAM login as a user that does not exist is checked against: no proof matches."""
    size = _hash_function(mechanism)().digest_size
    keys = secrets.token_bytes(size), secrets.token_bytes(size)
    return ScramCredential(stand_in_salt(name), *keys, DEFAULT_ITERATIONS)


class CredentialStore:
    """SCRAM credentials by user and mechanism, in one LMDB store; every write one durable commit."""

    def __init__(self, store: MetadataStore):
        self._store = store

    @classmethod
    def open(cls, fs: FileSystem, root: str) -> CredentialStore:
        """The root's credentials (security_store.open_security_store: StoreNotPrivateError)."""
        return cls(open_security_store(fs, root))

    @property
    def store(self) -> MetadataStore:
        """The security store, which the ACLs share."""
        return self._store

    @property
    def path(self) -> str:
        return self._store.path

    def _record(self, name: str) -> dict[str, Any] | None:
        raw = self._store.get(USER_PREFIX + name)
        if raw is None:
            return None
        record = msgpack.unpackb(raw, raw=False)
        assert isinstance(record, dict) and record.get("name") == name, (self.path, name)
        return record

    def scram(self, name: str, mechanism: str) -> ScramCredential | None:
        """`name`'s credential for `mechanism`, or None (no such user, or not for this mechanism)."""
        record = self._record(name)
        fields = None if record is None else record["scram"].get(mechanism)
        return None if fields is None else ScramCredential(**fields)

    def users(self) -> Iterator[tuple[str, dict[str, int]]]:
        """Every user, with the iterations of each mechanism it has, by name."""
        for key in sorted(self._store.keys(USER_PREFIX)):
            record = self._record(key[len(USER_PREFIX) :])
            if record is not None:
                yield record["name"], {m: c["iterations"] for m, c in sorted(record["scram"].items())}

    def check_plain(self, name: str, password: str) -> bool:
        """True if `password` is `name`'s (checked against its strongest SCRAM credential).

        An unknown user's password is salted and iterated all the same, so the time taken
        does not tell who exists."""
        record = self._record(name)
        if record is None:
            with contextlib.suppress(CredentialError):
                credential_from_password("SCRAM-SHA-512", password, DEFAULT_ITERATIONS, stand_in_salt(name))
            return False
        for mechanism in reversed(SCRAM_MECHANISMS):
            fields = record["scram"].get(mechanism)
            if fields is not None:
                stored = ScramCredential(**fields)
                try:
                    again = credential_from_password(mechanism, password, stored.iterations, stored.salt)
                except CredentialError:
                    return False  # no stored password is one SASLprep refuses
                return hmac.compare_digest(again.stored_key, stored.stored_key)
        return False

    def put(self, name: str, mechanism: str, credential: ScramCredential) -> None:
        check_user_name(name)
        _hash_function(mechanism)
        fields = {
            "salt": credential.salt,
            "stored_key": credential.stored_key,
            "server_key": credential.server_key,
            "iterations": credential.iterations,
        }

        def with_credential(raw: bytes | None) -> bytes:
            record: dict[str, Any] = (
                {"name": name, "scram": {}} if raw is None else msgpack.unpackb(raw, raw=False)
            )
            record["scram"][mechanism] = fields
            return bytes(msgpack.packb(record, use_bin_type=True))

        # Read and written in one transaction: a `users add` of another mechanism at the same
        # time (another process) is never lost.
        with committing(self._store, f"storing {mechanism} credentials of user {name!r}"):
            self._store.update(USER_PREFIX + name, with_credential)

    def delete(self, name: str, mechanism: str | None = None) -> bool:
        """Remove `name`'s credential for `mechanism` (every one if None); False if it had none."""
        found = False

        def without(raw: bytes | None) -> bytes | None:
            nonlocal found
            if raw is None:
                return None
            record = msgpack.unpackb(raw, raw=False)
            found = mechanism is None or mechanism in record["scram"]
            if mechanism is not None:
                record["scram"].pop(mechanism, None)
            if mechanism is None or not record["scram"]:
                return None
            return bytes(msgpack.packb(record, use_bin_type=True))

        with committing(self._store, f"removing credentials of user {name!r}"):
            self._store.update(USER_PREFIX + name, without)
        return found

    def close(self) -> None:
        self._store.close()
