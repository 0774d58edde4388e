"""The SASL users' store: SCRAM credentials, never a password, readable by the server's user alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp.utils import hi

from oncelog.server.credentials import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    CredentialError,
    CredentialStore,
    credential_from_password,
    credential_from_salted,
)
from oncelog.server.security_store import STORE_DIR, StoreNotPrivateError, check_private
from oncelog.storage.fs import DEFAULT_FS


@pytest.fixture
def store(tmp_path: Path) -> CredentialStore:
    return CredentialStore.open(DEFAULT_FS, str(tmp_path))


def test_a_new_store_is_private_to_the_servers_user(tmp_path: Path, store: CredentialStore) -> None:
    store.put("alice", "SCRAM-SHA-256", credential_from_password("SCRAM-SHA-256", "pw", MIN_ITERATIONS))
    directory = tmp_path / STORE_DIR
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    check_private(str(directory))
    store.close()


@pytest.mark.parametrize("loosened", ["directory", "data.mdb"])
def test_a_store_others_can_read_is_refused_by_name(
    tmp_path: Path, store: CredentialStore, loosened: str
) -> None:
    store.close()
    directory = tmp_path / STORE_DIR
    target = directory if loosened == "directory" else directory / loosened
    os.chmod(target, 0o755 if loosened == "directory" else 0o644)
    with pytest.raises(StoreNotPrivateError, match=str(target)):
        CredentialStore.open(DEFAULT_FS, str(tmp_path))


def test_no_password_is_stored_and_plain_logins_check_against_the_scram_keys(store: CredentialStore) -> None:
    password = "correct horse battery staple"
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.put("alice", mechanism, credential_from_password(mechanism, password, MIN_ITERATIONS))
    raw = b"".join(
        (Path(store.path) / name).read_bytes() for name in os.listdir(store.path) if name.endswith(".mdb")
    )
    assert password.encode() not in raw
    assert store.check_plain("alice", password)
    assert not store.check_plain("alice", password + "!")
    assert not store.check_plain("bob", password)
    store.close()


def test_a_stored_credential_logs_a_scramp_client_in(store: CredentialStore) -> None:
    # The store's keys are what an RFC 5802 client's proof is checked against: a full exchange.
    store.put("alice", "SCRAM-SHA-512", credential_from_password("SCRAM-SHA-512", "pw", MIN_ITERATIONS))
    credential = store.scram("alice", "SCRAM-SHA-512")
    assert credential is not None
    server = scramp.ScramMechanism("SCRAM-SHA-512").make_server(lambda user: credential.as_auth_info())
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "pw")
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())  # raises if the server's signature is wrong
    store.close()


@given(st.binary(min_size=12, max_size=64), st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
@settings(max_examples=20, deadline=None)
def test_a_credential_from_a_salted_password_equals_one_from_the_password(
    salt: bytes, mechanism: str
) -> None:
    # AlterUserScramCredentials sends the salted password; the keys must be what the password gives.
    hash_function = scramp.ScramMechanism(mechanism).hf
    salted = hi(hash_function, b"pw", salt, MIN_ITERATIONS)
    assert credential_from_salted(mechanism, salt, salted, MIN_ITERATIONS) == credential_from_password(
        mechanism, "pw", MIN_ITERATIONS, salt
    )


def test_delete_removes_one_mechanism_or_the_user(store: CredentialStore) -> None:
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.put("alice", mechanism, credential_from_password(mechanism, "pw", MIN_ITERATIONS))
    assert list(store.users()) == [
        ("alice", {"SCRAM-SHA-256": MIN_ITERATIONS, "SCRAM-SHA-512": MIN_ITERATIONS})
    ]
    assert store.delete("alice", "SCRAM-SHA-512")
    assert store.scram("alice", "SCRAM-SHA-512") is None and store.scram("alice", "SCRAM-SHA-256") is not None
    assert not store.delete("alice", "SCRAM-SHA-512")
    assert store.delete("alice")
    assert list(store.users()) == [] and not store.delete("alice")
    store.close()


@pytest.mark.parametrize(
    ("name", "mechanism", "iterations"),
    [
        ("", "SCRAM-SHA-256", MIN_ITERATIONS),
        ("x" * 300, "SCRAM-SHA-256", MIN_ITERATIONS),
        ("alice", "SCRAM-SHA-1", MIN_ITERATIONS),
        ("alice", "SCRAM-SHA-256", MIN_ITERATIONS - 1),
        ("alice", "SCRAM-SHA-256", MAX_ITERATIONS + 1),
    ],
    ids=["empty-name", "long-name", "unknown-mechanism", "too-few-iterations", "too-many-iterations"],
)
def test_what_the_store_does_not_take_is_refused_and_nothing_is_stored(
    store: CredentialStore, name: str, mechanism: str, iterations: int
) -> None:
    with pytest.raises(CredentialError):
        store.put(name, mechanism, credential_from_password(mechanism, "pw", iterations))
    assert list(store.users()) == []
    store.close()


def test_a_user_added_by_another_process_logs_in_at_once(tmp_path: Path, store: CredentialStore) -> None:
    # `oncelog users` while a server runs: the server reads the store at every login.
    added = subprocess.run(
        [sys.executable, "-m", "oncelog.cli", "users", str(tmp_path), "add", "alice", "--password-stdin"],
        input="pw\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    assert store.check_plain("alice", "pw") and not store.check_plain("alice", "pw\n")
    store.close()
