"""Run librdkafka's own integration suite against `oncelog serve` (`make compat`).

librdkafka 2.12.1's `tests/` come inside the npm package node-rdkafka 3.6.0;
`tests/compat/build_librdkafka.sh` unpacks and builds them under build/compat. This
script starts `oncelog serve` on a scratch root (topics auto-created with 4 partitions;
a second server that creates none for the suite's "noautocreate" scenario), points the
suite's test.conf at it and runs every test number that has a test meant for a real
cluster (not TEST_F_LOCAL, which use librdkafka's mock cluster; not
TEST_F_KNOWN_ISSUE), one number at a time with a timeout each, without the runner's
quick mode (-Q skips subtests and still says PASSED).

With `--security sasl_ssl` every server listens on SASL_SSL only (a certificate from a
trustme CA made for the run), the suite logs in with SCRAM-SHA-512 as a user made with
`oncelog users`, and every request is authorized: the user is no super user, ACLs made
with `oncelog acls` grant it everything (every topic, group and transactional id, and
the cluster), so each request goes through the decision.

Each test's state comes from the runner's JSON report. A test named in the allowlist
is counted as skipped with its reason (a number all of whose tests are allowlisted is
not run); a test that skips itself is counted apart with the reason it printed; any
other test that does not pass fails the run. The summary is printed, and written as
JSON with --json.

    python tests/compat/librdkafka_suite.py --build build/compat [--tests 0001,0012|fast|all]
        [--security plaintext|sasl_ssl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "librdkafka_allowlist.txt"
SUITE_DIR = Path("package/deps/librdkafka/tests")  # inside the build directory
KAFKA_VERSION = "3.7.0"  # what the suite gates its tests on
PARTITIONS = 4  # of each auto-created topic, as the suite's own clusters make them
# Quick tests (about a minute in all) that cover producing (compressed, idempotent),
# consuming, groups, offsets, partitions added and transactions: `make test` runs these;
# `make compat` runs everything.
FAST = (
    *("0001", "0002", "0005", "0012", "0013", "0017", "0019", "0021"),
    *("0031", "0034", "0036", "0044", "0063", "0090", "0099", "0129"),
)
DEFAULT_TIMEOUT_S = 900.0  # 0113 (cooperative rebalancing) takes about 5 minutes
_TEST_DECL = re.compile(r"_TEST\(\s*(\d{4})_(\w+)\s*,\s*([^,)]*)")
_SCENARIO = re.compile(r'\.scenario\s*=\s*"(\w+)"')


@dataclass
class SuiteTest:
    name: str
    flags: str
    scenario: str = "default"  # the suite's "noautocreate": a cluster that makes no topic on first use

    @property
    def number(self) -> str:
        return self.name[:4]

    @property
    def for_a_cluster(self) -> bool:
        return not any(flag in self.flags for flag in ("TEST_F_LOCAL", "TEST_F_KNOWN_ISSUE", "TEST_F_MANUAL"))


@dataclass
class Outcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> state or why
    skipped: dict[str, str] = field(default_factory=dict)  # name -> the allowlist's reason
    skipped_itself: dict[str, str] = field(default_factory=dict)  # name -> the reason it printed
    seconds: dict[str, float] = field(default_factory=dict)  # per test number

    def summary(self) -> dict[str, object]:
        return {
            "run": len(self.passed) + len(self.failed),
            "passed": len(self.passed),
            "passed_tests": sorted(self.passed),
            "failed": dict(sorted(self.failed.items())),
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_itself": dict(sorted(self.skipped_itself.items())),
            "seconds": round(sum(self.seconds.values()), 1),
        }


def declared_tests(suite: Path) -> list[SuiteTest]:
    """Every test the runner knows, from its table in test.c (name, flags and scenario)."""
    source = (suite / "test.c").read_text()
    table = source[source.index("struct test tests[]") :]
    starts = list(_TEST_DECL.finditer(table))
    tests = []
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        declaration = table[match.start() : following.start() if following else len(table)]
        scenario = _SCENARIO.search(declaration)
        tests.append(SuiteTest(f"{match[1]}_{match[2]}", match[3], scenario[1] if scenario else "default"))
    return tests


def read_allowlist(path: Path) -> dict[str, str]:
    """Test name (or number: all its tests) -> why it is not run here."""
    allowed: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}: {name} has no reason")
        allowed[name] = reason.strip()
    return allowed


# (the runner may print its next line without a line break: the reason ends where it begins)
_SKIPPING = re.compile(
    r"\[(\d{4}_\w+)\s*/\s*[0-9.]+s\] WARN: SKIPPING TEST: (.*?)(?=\[(?:\d{4}_|<MAIN>)|$)", re.M
)


def skip_reasons(log_path: Path) -> dict[str, str]:
    """The tests that skipped themselves in a runner's log, and the reason each printed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log_path.read_text(errors="replace"))
    return {name: reason.strip() for name, reason in _SKIPPING.findall(text)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


SASL_USER = "librdkafka"
SASL_PASSWORD = "compat-suite-password"
ONCELOG = str(Path(sys.executable).with_name("oncelog"))


@dataclass(frozen=True)
class Security:
    """How the servers listen and the suite connects: PLAINTEXT, or SASL_SSL with ACLs."""

    protocol: str  # "plaintext" or "sasl_ssl"
    directory: Path  # the run's certificates

    def prepare(self, root: Path) -> None:
        """The SASL user and the ACLs that let it do everything, stored before the server starts."""
        if self.protocol == "plaintext":
            return
        subprocess.run(
            [ONCELOG, "users", str(root), "add", SASL_USER, "--password-stdin", "--iterations", "4096"],
            input=f"{SASL_PASSWORD}\n".encode(),
            check=True,
            capture_output=True,
        )
        grant = [
            ONCELOG,
            "acls",
            str(root),
            "add",
            "--allow-principal",
            f"User:{SASL_USER}",
            "--operation",
            "all",
        ]
        for resource in (["--topic", "*"], ["--group", "*"], ["--transactional-id", "*"], ["--cluster"]):
            subprocess.run([*grant, *resource], check=True, capture_output=True)

    def listener_arguments(self, port: int) -> list[str]:
        if self.protocol == "plaintext":
            # 0081's ACLs switch authorization on; the suite's clients, anonymous here, stay
            # allowed everything, as they are on the suite's own clusters.
            return ["--listen", f"127.0.0.1:{port}", "--super-user", "User:ANONYMOUS"]
        return [
            *("--listener", f"SASL_SSL://127.0.0.1:{port}", "--sasl-mechanisms", "SCRAM-SHA-512"),
            *(
                "--ssl-cert",
                str(self.directory / "server.pem"),
                "--ssl-key",
                str(self.directory / "server.key"),
            ),
        ]

    def client_conf(self) -> str:
        if self.protocol == "plaintext":
            return ""
        return (
            "security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\n"
            f"sasl.username={SASL_USER}\nsasl.password={SASL_PASSWORD}\n"
            f"ssl.ca.location={self.directory / 'ca.pem'}\n"
        )

    @classmethod
    def make(cls, protocol: str, scratch: Path) -> Security:
        directory = scratch / "certs"
        if protocol == "sasl_ssl":
            import trustme  # (the dev extra's: certificates for the TLS tests)

            directory.mkdir()
            ca = trustme.CA()
            server = ca.issue_cert("127.0.0.1", "localhost")
            ca.cert_pem.write_to_path(str(directory / "ca.pem"))
            server.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
            server.private_key_pem.write_to_path(str(directory / "server.key"))
        return cls(protocol, directory)


class Server:
    """One `oncelog serve` on a scratch root, for the whole run."""

    def __init__(self, root: Path, log_path: Path, *, auto_create: bool, security: Security) -> None:
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        security.prepare(root)
        self._log = log_path.open("ab")
        self._process = subprocess.Popen(
            [
                ONCELOG,
                *("serve", str(root), "--partitions", str(PARTITIONS)),
                *security.listener_arguments(self.port),
                *(() if auto_create else ("--no-auto-create",)),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SystemExit(f"oncelog serve exited with {self._process.returncode}: see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"oncelog serve did not listen within 60 s: see {log_path}")

    def alive(self) -> bool:
        return self._process.poll() is None

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


def run_number(
    suite: Path, number: str, scenario: str, conf: Path, scratch: Path, timeout_s: float
) -> tuple[dict[str, str], float]:
    """Run the tests of one number in one scenario; each one's state from the runner's report."""
    report = scratch / f"report-{number}-{scenario}.json"
    env = dict(
        os.environ,
        TESTS=number,
        TEST_KAFKA_VERSION=KAFKA_VERSION,
        RDKAFKA_TEST_CONF=str(conf),
        TEST_REPORT=str(report),
        LD_LIBRARY_PATH=f"{suite.parent / 'src'}:{suite.parent / 'src-cpp'}",
    )
    log_path = scratch / f"test-{number}-{scenario}.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        # -L: no local (mock cluster) tests; -K: no known issues; -p1: one at a time.
        runner = subprocess.Popen(
            ["./test-runner", "-L", "-K", "-p1", "-s", scenario],
            cwd=suite,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            runner.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
            return {"*": f"timed out after {timeout_s:g} s (see {log_path})"}, time.monotonic() - started
    elapsed = time.monotonic() - started
    if not report.exists():
        return {"*": f"no report; exit {runner.returncode} (see {log_path})"}, elapsed
    tests = json.loads(report.read_text())["tests"]
    return {name: entry["state"] for name, entry in tests.items() if name.startswith(number)}, elapsed


def run_suite(build: Path, selection: str, timeout_s: float, scratch: Path, security: Security) -> Outcome:
    suite = build / SUITE_DIR
    if not (suite / "test-runner").exists():
        raise SystemExit(f"{suite / 'test-runner'} is missing: run tests/compat/build_librdkafka.sh {build}")
    allowed = read_allowlist(ALLOWLIST)
    tests = [test for test in declared_tests(suite) if test.for_a_cluster]
    if selection == "fast":
        tests = [test for test in tests if test.number in FAST]
    elif selection != "all":
        tests = [test for test in tests if test.number in selection.split(",")]
    outcome = Outcome()
    for test in tests:
        if test.name in allowed or test.number in allowed:
            outcome.skipped[test.name] = allowed.get(test.name) or allowed[test.number]
    to_run = [test for test in tests if test.name not in outcome.skipped]
    # The suite's "noautocreate" tests run against a server that creates no topic on first use.
    for scenario in sorted({test.scenario for test in to_run}):
        _run_scenario(
            suite,
            scenario,
            [test for test in to_run if test.scenario == scenario],
            timeout_s,
            scratch,
            outcome,
            security,
        )
    return outcome


def _run_scenario(
    suite: Path,
    scenario: str,
    tests: list[SuiteTest],
    timeout_s: float,
    scratch: Path,
    outcome: Outcome,
    security: Security,
) -> None:
    server = Server(
        scratch / f"root-{scenario}",
        scratch / f"serve-{scenario}.log",
        auto_create=scenario == "default",
        security=security,
    )
    conf = scratch / f"test-{scenario}.conf"
    conf.write_text(f"bootstrap.servers=127.0.0.1:{server.port}\n" + security.client_conf())
    numbers = sorted({test.number for test in tests})
    try:
        for n, number in enumerate(numbers, 1):
            names = [test.name for test in tests if test.number == number]
            states, outcome.seconds[f"{number}/{scenario}"] = run_number(
                suite, number, scenario, conf, scratch, timeout_s
            )
            reasons = skip_reasons(scratch / f"test-{number}-{scenario}.log")
            for name in names:
                state = states.get(name, states.get("*", "not reported"))
                if state == "PASSED":
                    outcome.passed.append(name)
                elif state == "SKIPPED" and name in reasons:
                    outcome.skipped_itself[name] = reasons[name]  # (librdkafka built without RapidJSON)
                else:
                    outcome.failed[name] = state
            print(
                f"[{scenario} {n}/{len(numbers)}] {number}: "
                + ", ".join(f"{name} {states.get(name, states.get('*', '?'))}" for name in names),
                flush=True,
            )
            if not server.alive():
                raise SystemExit(f"oncelog serve died during {number}: see {scratch}/serve-{scenario}.log")
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--build", type=Path, default=Path("build/compat"), help="where build_librdkafka.sh built"
    )
    parser.add_argument("--tests", default="all", help="all, fast, or test numbers (0001,0012)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="per test number")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, root)")
    parser.add_argument(
        "--security",
        choices=("plaintext", "sasl_ssl"),
        default="plaintext",
        help="sasl_ssl: SCRAM-SHA-512 over TLS, every request authorized by ACLs",
    )
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="oncelog-compat-"))
    failed = True
    try:
        security = Security.make(args.security, scratch)
        outcome = run_suite(args.build.resolve(), args.tests, args.timeout_s, scratch, security)
        failed = bool(outcome.failed)
        summary = outcome.summary()
        print(json.dumps(summary, indent=2))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if failed else 0
    finally:
        if args.keep or failed:
            print(f"logs and root kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
