"""`oncelog acls ROOT add|remove|list`: the ACLs a root's server authorizes by, from the command line."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.cli.main import main
from oncelog.server.acl_store import AclStore
from oncelog.server.acls import Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.security_store import STORE_DIR, open_security_store
from oncelog.storage.fs import DEFAULT_FS


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["acls", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _stored(root: Path) -> list[Acl]:
    store = open_security_store(DEFAULT_FS, str(root))
    try:
        return list(AclStore(store).current()[0].acls)
    finally:
        store.close()


def test_add_list_and_remove_as_kafka_acls_does(tmp_path: Path) -> None:
    root = str(tmp_path)
    status, out, _ = _run(
        root,
        "add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Write",
        "--operation",
        "describe",
        "--topic",
        "orders",
    )
    assert status == 0 and out.count("added ALLOW User:alice") == 2
    status, _, _ = _run(
        root,
        "add",
        "--deny-principal",
        "User:mallory",
        "--host",
        "10.0.0.9",
        "--operation",
        "All",
        "--group",
        "billing-",
        "--resource-pattern-type",
        "prefixed",
    )
    assert status == 0
    assert _run(root, "add", "--allow-principal", "User:ops", "--operation", "alter", "--cluster")[0] == 0
    assert sorted(_stored(tmp_path)) == sorted(
        [
            Acl(
                ResourceType.TOPIC,
                "orders",
                PatternType.LITERAL,
                "User:alice",
                "*",
                Operation.WRITE,
                Permission.ALLOW,
            ),
            Acl(
                ResourceType.TOPIC,
                "orders",
                PatternType.LITERAL,
                "User:alice",
                "*",
                Operation.DESCRIBE,
                Permission.ALLOW,
            ),
            Acl(
                ResourceType.GROUP,
                "billing-",
                PatternType.PREFIXED,
                "User:mallory",
                "10.0.0.9",
                Operation.ALL,
                Permission.DENY,
            ),
            Acl(
                ResourceType.CLUSTER,
                "kafka-cluster",
                PatternType.LITERAL,
                "User:ops",
                "*",
                Operation.ALTER,
                Permission.ALLOW,
            ),
        ]
    )
    status, out, _ = _run(root, "list", "--group", "billing-invoices", "--resource-pattern-type", "match")
    assert out.splitlines() == ["DENY User:mallory from 10.0.0.9 to ALL GROUP billing- (PREFIXED)"]
    assert len(_run(root, "list")[1].splitlines()) == 4
    status, out, _ = _run(root, "remove", "--principal", "User:alice")
    assert status == 0 and out.splitlines()[-1] == "2 ACLs removed"
    assert len(_stored(tmp_path)) == 2
    assert _run(root, "remove", "--all")[1].splitlines()[-1] == "2 ACLs removed"
    assert _stored(tmp_path) == []


def test_the_store_it_creates_is_private_to_the_user(tmp_path: Path) -> None:
    assert (
        _run(str(tmp_path), "add", "--allow-principal", "User:a", "--operation", "read", "--topic", "t")[0]
        == 0
    )
    directory = tmp_path / STORE_DIR
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(directory / name).st_mode) == 0o600 for name in os.listdir(directory))


def test_list_and_remove_on_a_root_without_a_store_create_nothing(tmp_path: Path) -> None:
    assert _run(str(tmp_path), "list") == (0, "", "")
    assert _run(str(tmp_path), "remove", "--topic", "t")[1] == "0 ACLs removed\n"
    assert not (tmp_path / STORE_DIR).exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["add", "--operation", "read", "--topic", "t"], "--allow-principal or --deny-principal"),
        (["add", "--allow-principal", "alice", "--operation", "read", "--topic", "t"], "TYPE:NAME"),
        (
            [
                "add",
                "--allow-principal",
                "User:a",
                "--operation",
                "read",
                "--topic",
                "*",
                "--resource-pattern-type",
                "prefixed",
            ],
            "names nothing",
        ),
        (["remove"], "remove needs a resource"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_stores_nothing(
    tmp_path: Path, argv: list[str], says: str
) -> None:
    status, _, err = _run(str(tmp_path), *argv)
    assert status == 2 and says in err and len(err.splitlines()) == 1, err
    # Refused before anything is made: a typo's root and its store are not created.
    assert not (tmp_path / STORE_DIR).exists()
    assert _run(str(tmp_path / "typo"), *argv)[0] == 2
    assert not (tmp_path / "typo").exists()


def test_a_store_others_can_read_is_refused(tmp_path: Path) -> None:
    assert (
        _run(str(tmp_path), "add", "--allow-principal", "User:a", "--operation", "read", "--topic", "t")[0]
        == 0
    )
    os.chmod(tmp_path / STORE_DIR, 0o755)
    status, _, err = _run(str(tmp_path), "list")
    assert status == 2 and "chmod -R go=" in err


def test_a_partition_directory_is_not_a_root(tmp_path: Path) -> None:
    partition = tmp_path / "orders-0"
    partition.mkdir()
    (partition / "00000000000000000000.log").write_bytes(b"")
    status, _, err = _run(str(partition), "list")
    assert status == 2 and "partition directory" in err


def test_a_host_is_stored_as_requests_name_theirs_and_a_host_name_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path)
    add = ["add", "--deny-principal", "User:bob", "--operation", "read", "--topic", "t"]
    assert _run(root, *add, "--host", "0:0:0:0:0:0:0:1")[0] == 0
    assert [acl.host for acl in _stored(tmp_path)] == ["::1"]
    status, _, err = _run(root, *add, "--host", "localhost")
    assert status == 2 and "IP address" in err and len(err.splitlines()) == 1
    assert _run(root, "list", "--host", "0000::1")[1].count("DENY") == 1


def test_text_that_is_not_utf_8_is_refused_with_one_line(tmp_path: Path) -> None:
    status, _, err = _run(
        str(tmp_path), "add", "--allow-principal", "User:\udcff", "--operation", "read", "--topic", "t"
    )
    assert status == 2 and "not UTF-8" in err and "Traceback" not in err


def test_a_store_that_is_a_symbolic_link_is_refused_and_nothing_is_created_where_it_points(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    root = tmp_path / "root"
    root.mkdir()
    (root / STORE_DIR).symlink_to(elsewhere)
    status, _, err = _run(
        str(root), "add", "--allow-principal", "User:a", "--operation", "read", "--topic", "t"
    )
    assert status == 2 and "symbolic link" in err
    assert list(elsewhere.iterdir()) == []


def test_a_users_add_and_an_acls_add_creating_the_store_at_once_both_succeed(tmp_path: Path) -> None:
    # Found by a red-team run: the other process's staging directory made the root look like
    # a stranger's directory, and one of the two exited 2.
    oncelog = str(Path(sys.executable).parent / "oncelog")
    for attempt in range(3):
        root = tmp_path / f"root-{attempt}"
        users = subprocess.Popen(
            [oncelog, "users", str(root), "add", "alice", "--password-stdin", "--iterations", "4096"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        acls = subprocess.Popen(
            [
                oncelog,
                "acls",
                str(root),
                "add",
                "--allow-principal",
                "User:alice",
                "--operation",
                "read",
                "--topic",
                "t",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, users_err = users.communicate(b"pw\n", timeout=60)
        _, acls_err = acls.communicate(timeout=60)
        assert (users.returncode, acls.returncode) == (0, 0), (users_err, acls_err)
        assert len(_stored(root)) == 1


def test_a_leftover_staging_directory_or_an_empty_store_directory_does_not_stop_a_new_root(
    tmp_path: Path,
) -> None:
    (tmp_path / "a" / f"{STORE_DIR}.new.k1ll3d").mkdir(parents=True)  # a creation killed part-way
    (tmp_path / "b" / STORE_DIR).mkdir(parents=True, mode=0o700)  # made by hand, empty
    for root in (tmp_path / "a", tmp_path / "b"):
        assert (
            _run(str(root), "add", "--allow-principal", "User:a", "--operation", "read", "--topic", "t")[0]
            == 0
        )
        assert len(_stored(root)) == 1
