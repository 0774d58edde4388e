"""What authorization costs a request: `python bench/acl_decisions.py [ROUNDS]`.

A root with 1,100 ACLs (1,000 literal topic ACLs of 50 principals, 100 prefixed ones),
in a security store on disk. Per round (median, and min-max over rounds), in microseconds:

- `access`: what each request pays once: the store's commit count read from LMDB's meta
  page, compared with the cached ACL set's (Authorizer.access);
- `cached`: one decision already made for this ACL set (Access.topic);
- `uncached`: one decision made afresh (AclSet._decide): the literal ACLs of the name,
  of `*`, and the prefixed ones, one dict lookup per prefix length.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import timeit

from oncelog.server.acl_store import AclStore
from oncelog.server.acls import Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.authorization import Authorizer
from oncelog.server.listeners import PLAINTEXT, Listener
from oncelog.server.sasl import Session
from oncelog.server.security_store import open_security_store
from oncelog.storage.fs import DEFAULT_FS

CALLS = 20_000


def _acls() -> list[Acl]:
    topic, allow = ResourceType.TOPIC, Permission.ALLOW
    literal = [
        Acl(topic, f"t{i}", PatternType.LITERAL, f"User:u{i % 50}", "*", Operation.WRITE, allow)
        for i in range(1000)
    ]
    prefixed = [
        Acl(topic, f"p{i}-", PatternType.PREFIXED, "User:bob", "*", Operation.READ, allow) for i in range(100)
    ]
    return literal + prefixed


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = open_security_store(DEFAULT_FS, root)
        try:
            acls = AclStore(store)
            acls.add(_acls())
            authorizer = Authorizer(acls, (), authenticates=True)
            session = Session.for_listener(Listener(PLAINTEXT, "127.0.0.1", 0), "User:u7")
            access = authorizer.access(session, "127.0.0.1")
            current = acls.current()[0]
            rows: dict[str, list[float]] = {"access": [], "cached": [], "uncached": []}
            for _ in range(rounds):
                calls = {
                    "access": lambda: authorizer.access(session, "127.0.0.1"),
                    "cached": lambda: access.topic(Operation.WRITE, "t7"),
                    "uncached": lambda: current._decide(
                        "User:u7", "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, "p55-orders"
                    ),
                }
                for name, call in calls.items():
                    rows[name].append(timeit.timeit(call, number=CALLS) / CALLS * 1e6)
        finally:
            store.close()
    for name, times in rows.items():
        print(f"{name:9s} {statistics.median(times):6.2f} us  ({min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
