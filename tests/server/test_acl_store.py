"""The root's ACLs (oncelog.server.acl_store): durable, one commit a change, seen by every process at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.server import acl_store
from oncelog.server.acl_store import AclStore, TooManyAclsError
from oncelog.server.acls import (
    Acl,
    AclFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from oncelog.server.security_store import open_security_store
from oncelog.storage.fs import DEFAULT_FS
from oncelog.torture.faultfs import FaultFileSystem


def _acl(name: str, principal: str = "User:alice", operation: Operation = Operation.READ) -> Acl:
    return Acl(ResourceType.TOPIC, name, PatternType.LITERAL, principal, "*", operation, Permission.ALLOW)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AclStore]:
    opened = open_security_store(DEFAULT_FS, str(tmp_path))
    yield AclStore(opened)
    opened.close()


def test_a_new_root_has_no_acls_and_authorization_is_off(store: AclStore) -> None:
    acls, ever = store.current()
    assert len(acls) == 0 and not ever


def test_added_acls_survive_a_reopen(tmp_path: Path) -> None:
    first = open_security_store(DEFAULT_FS, str(tmp_path))
    AclStore(first).add([_acl("orders"), _acl("orders"), _acl("payments")])  # the same ACL twice: kept once
    first.close()
    reopened = open_security_store(DEFAULT_FS, str(tmp_path))
    try:
        acls, ever = AclStore(reopened).current()
    finally:
        reopened.close()
    assert list(acls.acls) == sorted([_acl("orders"), _acl("payments")]) and ever


def test_removing_the_last_acl_keeps_authorization_on(store: AclStore) -> None:
    store.add([_acl("orders")])
    (removed,) = store.remove([AclFilter()])
    assert removed == [_acl("orders")]
    acls, ever = store.current()
    assert len(acls) == 0 and ever  # a server that was closed stays closed


def test_a_remove_that_matches_nothing_on_a_new_root_does_not_switch_authorization_on(
    store: AclStore,
) -> None:
    assert store.remove([AclFilter(principal="User:nobody")]) == [[]]
    assert store.current()[1] is False


def test_each_filter_reports_what_it_removed_and_all_of_it_goes_in_one_commit(store: AclStore) -> None:
    store.add([_acl("orders"), _acl("payments"), _acl("orders", "User:bob")])
    removed = store.remove([AclFilter(name="orders"), AclFilter(principal="User:alice")])
    assert removed == [
        sorted([_acl("orders"), _acl("orders", "User:bob")]),
        sorted([_acl("orders"), _acl("payments")]),
    ]
    assert len(store.current()[0]) == 0


def test_an_invalid_acl_stores_nothing_of_its_request(store: AclStore) -> None:
    bad = Acl(
        ResourceType.CLUSTER, "other", PatternType.LITERAL, "User:a", "*", Operation.ALTER, Permission.ALLOW
    )
    with pytest.raises(InvalidAclError, match="kafka-cluster"):
        store.add([_acl("orders"), bad])
    assert store.current() == (store.current()[0], False) and len(store.current()[0]) == 0


def test_past_the_limit_nothing_is_added(store: AclStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acl_store, "MAX_ACLS", 3)
    store.add([_acl("a"), _acl("b")])
    with pytest.raises(TooManyAclsError, match="at most 3"):
        store.add([_acl("c"), _acl("d")])
    assert [a.name for a in store.current()[0].acls] == ["a", "b"]


def test_a_change_by_another_process_is_seen_at_the_next_read(tmp_path: Path, store: AclStore) -> None:
    store.add([_acl("orders")])
    assert len(store.current()[0]) == 1  # cached now
    script = (
        "import sys\n"
        "from oncelog.server.acl_store import AclStore\n"
        "from oncelog.server.acls import AclFilter\n"
        "from oncelog.server.security_store import open_security_store\n"
        "from oncelog.storage.fs import DEFAULT_FS\n"
        "s = open_security_store(DEFAULT_FS, sys.argv[1])\n"
        "AclStore(s).remove([AclFilter(name='orders')])\n"
        "s.close()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    assert len(store.current()[0]) == 0


def test_the_fault_injecting_twin_stores_acls_through_the_seam(tmp_path: Path) -> None:
    fs = FaultFileSystem(1)
    opened = fs.open_store(str(tmp_path / "security.lmdb"))
    store = AclStore(opened)
    store.add([_acl("orders")])
    before = opened.generation()
    assert store.current()[1]
    store.add([_acl("payments")])
    assert opened.generation() != before
    assert [a.name for a in store.current()[0].acls] == ["orders", "payments"]
