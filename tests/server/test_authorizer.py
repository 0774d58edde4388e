"""When authorization applies and what each request's Access decides (oncelog.server.authorization)."""

from __future__ import annotations

import itertools
from pathlib import Path

from oncelog.server.acl_store import AclStore
from oncelog.server.acls import Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.authorization import Authorizer
from oncelog.server.listeners import PLAINTEXT, Listener
from oncelog.server.sasl import Session
from oncelog.torture.faultfs import FaultFileSystem

_stores = itertools.count()


def _store(tmp_path: Path) -> AclStore:
    return AclStore(FaultFileSystem(1).open_store(str(tmp_path / f"security-{next(_stores)}.lmdb")))


def _session(principal: str) -> Session:
    return Session.for_listener(Listener(PLAINTEXT, "127.0.0.1", 0), principal)


def _deny_alice_everything() -> Acl:
    return Acl(
        ResourceType.TOPIC, "*", PatternType.LITERAL, "User:alice", "*", Operation.ALL, Permission.DENY
    )


def test_a_server_that_cannot_tell_clients_apart_and_has_no_acls_allows_everything(tmp_path: Path) -> None:
    access = Authorizer(_store(tmp_path), (), authenticates=False).access(
        _session("User:ANONYMOUS"), "1.2.3.4"
    )
    assert not access.enforced
    assert access.topic(Operation.WRITE, "any") and access.cluster(Operation.ALTER)


def test_authentication_a_super_user_or_a_first_acl_each_switch_authorization_on(tmp_path: Path) -> None:
    anonymous = _session("User:ANONYMOUS")
    assert Authorizer(_store(tmp_path), (), authenticates=True).access(anonymous, "h").enforced
    assert Authorizer(_store(tmp_path), ("User:root",), authenticates=False).access(anonymous, "h").enforced
    store = _store(tmp_path)
    authorizer = Authorizer(store, (), authenticates=False)
    store.add([_deny_alice_everything()])
    access = authorizer.access(anonymous, "h")  # the next request after the change
    assert access.enforced and not access.topic(Operation.READ, "orders")


def test_a_super_user_is_allowed_what_a_deny_forbids(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add([_deny_alice_everything()])
    authorizer = Authorizer(store, ("User:alice",), authenticates=True)
    assert authorizer.access(_session("User:alice"), "h").topic(Operation.WRITE, "orders")
    assert not authorizer.access(_session("User:bob"), "h").topic(Operation.WRITE, "orders")
