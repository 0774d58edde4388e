"""`oncelog serve` refuses bad input with one line and exit 2, and its --help explains itself."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from oncelog.cli.main import build_parser, main
from oncelog.cli.serve import serve_config, unservable_root
from oncelog.server.acl_store import AclStore
from oncelog.server.acls import Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.credentials import CredentialStore
from oncelog.server.listeners import parse_address
from oncelog.server.security_store import open_security_store
from oncelog.storage.fs import DEFAULT_FS


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["serve", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "nohost"], "expected HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "expected HOST:PORT"),
        (["--advertise", "host:"], "expected HOST:PORT"),
        (["--partitions", "0"], "partitions must be 1..10000"),
        (["--threads", "0"], "recovery_threads must be 1..64"),
        (["--max-connections-per-ip", "0"], "must be positive"),
        (["--first-request-ms", "0"], "must be positive"),
        (["--max-unsent-bytes", "0"], "max unsent bytes"),
        (["--cleaner-threads", "-1"], "cleaner threads must be 0 or more"),
        (["--cleaner-io-bytes-per-s", "0"], "I/O cap positive"),
        (["--cleaner-backoff-ms", "0"], "its backoff"),
        (["--listener", "KERBEROS://127.0.0.1:0"], "listener name must be one of"),
        (["--listener", "SSL://127.0.0.1:0"], "needs a certificate and its key"),
        (["--ssl-cert", "c.pem"], "--ssl-cert and --ssl-key go together"),
        (
            ["--listener", "SASL_PLAINTEXT://127.0.0.1:0", "--sasl-mechanisms", "GSSAPI"],
            "SASL mechanisms must be",
        ),
        (["--ssl-principal-rule", "RULE:x"], "expected DEFAULT or RULE:"),
        (["--super-user", "User:\udcff"], "a super user is a principal"),
        (["--listen", "0.0.0.0:9092"], "accepts anyone who can reach it"),
        (["--listener", "PLAINTEXT://10.1.2.3:9092"], "--allow-anonymous"),
        (["--listener", "SSL://0.0.0.0:0", "--ssl-cert", "c", "--ssl-key", "k"], "--allow-anonymous"),
        (
            ["--listener", "SASL_SSL://0.0.0.0:0", "--ssl-cert", "c", "--ssl-key", "k", "--ssl-ca", "a"],
            "there is none",
        ),
        (["--advertise", "PLAINTEXT://b:0"], "cannot connect to port 0"),
        (
            ["--listener", "SSL://127.0.0.1:0", "--ssl-cert", "no.pem", "--ssl-key", "no.key"],
            "cannot read no.pem",
        ),
        (["--ssl-principal-rule", "RULE:^CN=(.*)$/$2/"], "names group $2"),
        (
            ["--listener", "SSL://0.0.0.0:0", "--listener", "SSL://0.0.0.0:1"],
            "each listener name may be given once",
        ),
        (["--listener", "SSL://0.0.0.0:0", "--listen", "127.0.0.1:0", "--advertise", "b:1"], "name one"),
    ],
)
def test_bad_options_exit_2_with_one_line_and_create_nothing(
    tmp_path: Path, args: list[str], says: str
) -> None:
    root = tmp_path / "root"
    status, _, err = _run(str(root), *args)
    assert status == 2
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_port_in_use_exits_2_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, err = _run(str(tmp_path / "root"), "--listen", f"127.0.0.1:{port}", "--no-progress")
    assert status == 2
    assert f"cannot listen on PLAINTEXT://127.0.0.1:{port}" in err


def test_help_says_what_is_served_what_is_not_and_when_an_ack_is_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, _ = _run("--help")
    out = capsys.readouterr().out  # argparse prints --help to sys.stdout
    assert status == 0
    for words in (
        "idempotence",
        "assign()",
        "subscribe()",
        "transactional.id",
        "coordinator.lmdb",
        "Topic configs are served",
        "KIP-848 consumer protocol are not",
        "exits 130",
        "--fsync-acks",
        "SIGTERM",
        "kill -9",
        "exit status",
        "--max-connections-per-ip",
        "--first-request-ms",
        "__consumer_offsets",
    ):
        assert words in out, words


def test_addresses_parse_with_ipv6_brackets() -> None:
    assert parse_address("[::1]:9092") == ("::1", 9092)
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)


def test_a_directory_that_is_neither_empty_nor_a_root_is_refused_as_a_likely_typo(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine\n")
    status, _, err = _run(str(tmp_path / "home"), "--listen", "127.0.0.1:0")
    assert status == 2 and "neither a LogManager root nor empty" in err
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["notes.txt"]  # nothing created


def test_a_credential_store_others_can_read_stops_serve_before_any_recovery(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = root / "security.lmdb"
    store.mkdir(mode=0o755)
    status, out, err = _run(str(root), "--listen", "127.0.0.1:0", "--no-progress")
    assert status == 2
    assert str(store) in err and "chmod -R go=" in err and "Traceback" not in err
    assert "recovered" not in out


def test_help_explains_listeners_tls_sasl_and_the_anonymous_refusal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, _ = _run("--help")
    out = capsys.readouterr().out
    assert status == 0
    for words in (
        "--listener",
        "SASL_SSL",
        "--ssl-ca",
        "--ssl-principal-rule",
        "SCRAM-SHA-512",
        "oncelog users ROOT add",
        "--allow-anonymous",
        "security.lmdb",
        "in the clear",
    ):
        assert words in out, words


def test_a_root_holding_only_its_users_is_served_as_a_new_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    CredentialStore.open(DEFAULT_FS, str(root)).close()  # `oncelog users ROOT add` before the first serve
    assert unservable_root(str(root)) is None
    (root / "stray.txt").write_text("x")
    assert "neither a LogManager root nor empty" in (unservable_root(str(root)) or "")


def _grant_anonymous_read(root: Path) -> None:
    store = open_security_store(DEFAULT_FS, str(root))
    read = Permission.ALLOW
    AclStore(store).add(
        [Acl(ResourceType.TOPIC, "public", PatternType.LITERAL, "User:ANONYMOUS", "*", Operation.READ, read)]
    )
    store.close()


def _config_of(root: Path, *argv: str) -> object:
    args = build_parser().parse_args(["serve", str(root), *argv])
    return serve_config(args)


def test_a_public_plaintext_listener_starts_once_acls_decide_what_anonymous_clients_may_do(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(ValueError, match="the root has no ACLs"):
        _config_of(root, "--listen", "0.0.0.0:0")
    _grant_anonymous_read(root)
    assert _config_of(root, "--listen", "0.0.0.0:0") is not None
    # A super user switches authorization on as well (anonymous clients then get no ACL's grant).
    assert _config_of(tmp_path / "other", "--listen", "0.0.0.0:0", "--super-user", "User:admin") is not None
