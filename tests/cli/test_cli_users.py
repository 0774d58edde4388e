"""`oncelog users ROOT add|delete|list`: SASL users from the command line, passwords never in argv."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.cli.main import main
from oncelog.server.credentials import CredentialStore
from oncelog.storage.fs import DEFAULT_FS


def _run(monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    out, err = io.StringIO(), io.StringIO()
    status = main(["users", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_add_list_and_delete_a_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path)
    status, out, _ = _run(
        monkeypatch, root, "add", "alice", "--password-stdin", "--iterations", "4096", stdin="s3cret\n"
    )
    assert status == 0 and out.count("stored") == 2
    status, out, _ = _run(
        monkeypatch, root, "add", "bob", "--password-stdin", "--mechanism", "SCRAM-SHA-512", stdin="hunter2\n"
    )
    assert status == 0
    status, out, _ = _run(monkeypatch, root, "list")
    assert out.splitlines() == [
        "alice: SCRAM-SHA-256 (4096 iterations), SCRAM-SHA-512 (4096 iterations)",
        "bob: SCRAM-SHA-512 (8192 iterations)",
    ]
    store = CredentialStore.open(DEFAULT_FS, root)
    assert store.check_plain("alice", "s3cret") and store.check_plain("bob", "hunter2")
    store.close()
    assert _run(monkeypatch, root, "delete", "alice")[0] == 0
    status, _, err = _run(monkeypatch, root, "delete", "alice")
    assert status == 2 and "has no credentials" in err
    assert _run(monkeypatch, root, "list")[1].splitlines() == ["bob: SCRAM-SHA-512 (8192 iterations)"]


@pytest.mark.parametrize(
    ("argv", "stdin", "says"),
    [
        (["add", "alice", "--password-stdin"], "\n", "the password is empty"),
        (["add", "alice"], "", "--password-stdin"),  # no terminal to prompt on
        (["add", "alice", "--password-stdin", "--iterations", "10"], "pw\n", "iterations must be"),
        (["add", "alice", "--password-stdin"], "bell\a\n", "the password cannot be used"),
        (["add", "", "--password-stdin"], "pw\n", "a user name is"),
        (["add", "caf\udce9", "--password-stdin"], "pw\n", "UTF-8 text"),  # a name argv could not decode
    ],
)
def test_bad_input_exits_2_with_one_line_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], stdin: str, says: str
) -> None:
    status, _, err = _run(monkeypatch, str(tmp_path), *argv, stdin=stdin)
    assert status == 2 and says in err and err.count("\n") == 1, err
    assert _run(monkeypatch, str(tmp_path), "list")[1] == ""
    # Refused before anything is made: a typo's root and its store are not created.
    assert _run(monkeypatch, str(tmp_path / "typo"), *argv, stdin=stdin)[0] == 2
    assert not (tmp_path / "typo").exists() and not (tmp_path / "security.lmdb").exists()


def test_the_first_users_of_a_new_root_create_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "new-root"
    assert _run(monkeypatch, str(root), "add", "alice", "--password-stdin", stdin="pw\n")[0] == 0
    assert [path.name for path in root.iterdir()] == ["security.lmdb"]
    status, _, err = _run(monkeypatch, str(tmp_path / "missing"), "list")
    assert status == 2 and "is not a directory" in err
    assert not (tmp_path / "missing").exists()


def test_listing_a_root_with_no_users_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(monkeypatch, str(tmp_path), "list") == (0, "", "")
    status, _, err = _run(monkeypatch, str(tmp_path), "delete", "alice")
    assert status == 2 and "has no credentials" in err
    assert list(tmp_path.iterdir()) == []


def test_a_partition_directory_is_not_a_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "orders-0").mkdir()
    (tmp_path / "orders-0" / "00000000000000000000.log").write_bytes(b"")
    status, _, err = _run(monkeypatch, str(tmp_path / "orders-0"), "list")
    assert status == 2 and "is a partition directory" in err


def test_two_processes_adding_mechanisms_of_one_user_at_once_keep_both(tmp_path: Path) -> None:
    # Each add reads the user's record and writes it back: in one LMDB transaction, so neither
    # overwrites the other's mechanism (a red team lost one in 2 of 40 runs before).
    root = tmp_path / "root"
    root.mkdir()
    for _ in range(6):
        adds = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "oncelog.cli",
                    "users",
                    str(root),
                    "add",
                    "bob",
                    "--password-stdin",
                    "--mechanism",
                    mechanism,
                    "--iterations",
                    "4096",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
        ]
        for add in adds:
            _, err = add.communicate("pw\n", timeout=60)
            assert add.returncode == 0, err
        store = CredentialStore.open(DEFAULT_FS, str(root))
        assert dict(store.users()) == {"bob": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 4096}}
        assert store.delete("bob")
        store.close()
