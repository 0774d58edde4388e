"""Kafka's access control lists: what an ACL is, which ACLs a filter selects, and the decision.

An ACL says that a principal (`User:alice`, or `User:*` for everyone), connecting from a
host (an address, or `*`), is allowed or denied an operation on the resources a pattern
names: one resource (LITERAL; the name `*` is every resource of the type) or every
resource whose name starts with a prefix (PREFIXED). Resource types are topics, groups,
transactional ids and the cluster (whose one name is `kafka-cluster`).

The decision (`AclSet.allows`), as Kafka's authorizer makes it:
- a super user is allowed everything;
- any DENY that matches (the operation itself, or ALL) denies, whatever allows;
- else any ALLOW that matches allows: the operation itself, ALL, and for DESCRIBE also
  READ, WRITE, DELETE and ALTER, for DESCRIBE_CONFIGS also ALTER_CONFIGS (who may change
  a thing may look at it);
- else denied: no ACL, no access (Kafka's allow.everyone.if.no.acl.found, which would
  open every resource no ACL names, the cluster's ACLs and credentials included, is not
  offered).

`AclSet.allows_any` is Kafka's authorizeByResourceType, which InitProducerId asks when an
idempotent producer has no IdempotentWrite on the cluster: is some resource of the type
allowed, by an ALLOW that no DENY covers wholly?

The codes are Kafka's (ResourceType, PatternType, AclOperation, AclPermissionType); the
wire and the store both use them.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

CLUSTER_NAME: Final = "kafka-cluster"
WILDCARD: Final = "*"
WILDCARD_PRINCIPAL: Final = "User:*"
# The longest resource name, principal or host an ACL may hold (a topic name is at most
# 249 characters; a group or transactional id has no bound in Kafka, this is ours).
MAX_NAME_CHARS: Final = 1024
# Decisions an AclSet remembers before it forgets them all, and the characters of the names
# they are keyed on (a client names what it likes: a 1 MB group id must not stay cached).
MAX_DECISIONS_CACHED: Final = 16_384
MAX_CACHED_NAME_CHARS: Final = 1 << 20


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # a filter's: every pattern type, the name as given
    MATCH = 2  # a filter's: every ACL that applies to the named resource
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# The resource types an ACL may name here (Kafka's delegation tokens and users are not served).
ACL_RESOURCE_TYPES: Final = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
# The operations Kafka reports, when asked, that a principal has on each kind of resource.
TOPIC_OPERATIONS: Final = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
)
GROUP_OPERATIONS: Final = (Operation.READ, Operation.DELETE, Operation.DESCRIBE)
CLUSTER_OPERATIONS: Final = (
    Operation.CREATE,
    Operation.CLUSTER_ACTION,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
    Operation.IDEMPOTENT_WRITE,
    Operation.ALTER,
    Operation.DESCRIBE,
)
# The operations an ALLOW of each grants besides itself and ALL.
_IMPLIED_BY: Final = {
    Operation.DESCRIBE: (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.ALTER_CONFIGS,),
}


class InvalidAclError(ValueError):
    """An ACL or filter Kafka would not take; the message says which field and why."""


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    resource_type: ResourceType
    name: str
    pattern: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def as_row(self) -> list[object]:
        return [
            int(self.resource_type),
            self.name,
            int(self.pattern),
            self.principal,
            self.host,
            int(self.operation),
            int(self.permission),
        ]

    @classmethod
    def from_row(cls, row: list[object]) -> Acl:
        kind, name, pattern, principal, host, operation, permission = row
        assert isinstance(name, str) and isinstance(principal, str) and isinstance(host, str), row
        assert isinstance(kind, int) and isinstance(pattern, int), row
        assert isinstance(operation, int) and isinstance(permission, int), row
        return cls(
            ResourceType(kind),
            name,
            PatternType(pattern),
            principal,
            host,
            Operation(operation),
            Permission(permission),
        )

    def applies_to(self, name: str) -> bool:
        """Whether this ACL's pattern names the resource `name` (of its type)."""
        if self.pattern is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)

    def describe(self) -> str:
        """One line for people: `ALLOW User:alice from * to WRITE TOPIC orders (LITERAL)`."""
        return (
            f"{self.permission.name} {self.principal} from {self.host} to {self.operation.name} "
            f"{self.resource_type.name} {self.name} ({self.pattern.name})"
        )


def _check_principal(principal: str) -> None:
    kind, colon, name = principal.partition(":")
    if not colon or not kind or not name:
        raise InvalidAclError(f"a principal is TYPE:NAME (User:alice, User:*), got {principal!r}")


def check_acl(acl: Acl) -> None:
    """InvalidAclError unless `acl` can be stored: Kafka's rules for CreateAcls."""
    if acl.resource_type not in ACL_RESOURCE_TYPES:
        raise InvalidAclError(
            f"the resource type must be one of {', '.join(t.name for t in ACL_RESOURCE_TYPES)}, "
            f"got {acl.resource_type.name}"
        )
    if acl.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError(f"the pattern type must be LITERAL or PREFIXED, got {acl.pattern.name}")
    if acl.operation in (Operation.ANY, Operation.UNKNOWN):
        raise InvalidAclError(f"an ACL names one operation (or ALL), got {acl.operation.name}")
    if acl.permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAclError(f"the permission must be ALLOW or DENY, got {acl.permission.name}")
    if not acl.name:
        raise InvalidAclError("the resource name is empty")
    if acl.resource_type is ResourceType.CLUSTER and (
        acl.name != CLUSTER_NAME or acl.pattern is not PatternType.LITERAL
    ):
        raise InvalidAclError(f"the cluster's one resource is the LITERAL name {CLUSTER_NAME!r}")
    if acl.pattern is PatternType.PREFIXED and acl.name == WILDCARD:
        raise InvalidAclError("a PREFIXED pattern of '*' names nothing: use LITERAL '*' for every resource")
    _check_principal(acl.principal)
    if acl.host != normal_host(acl.host):
        raise InvalidAclError(
            f"the host {acl.host!r} is written {normal_host(acl.host)!r} here (normal_host)"
        )
    for what, text in (("resource name", acl.name), ("principal", acl.principal), ("host", acl.host)):
        if len(text) > MAX_NAME_CHARS:
            raise InvalidAclError(f"the {what} is {len(text)} characters, more than {MAX_NAME_CHARS}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidAclError(f"the {what} {text!r} is not UTF-8 text") from exc


def normal_host_filter(host: str | None) -> str | None:
    """A filter's host as the ACLs hold it (normal_host), or as given if it names no address."""
    try:
        return host if host is None else normal_host(host)
    except InvalidAclError:
        return host  # (it matches no stored ACL: none holds anything but '*' and addresses)


def normal_host(host: str) -> str:
    """`host` as requests name theirs: `*`, or an IP address in Python's short form (`::1`,
    where Java writes `0:0:0:0:0:0:0:1`; `::ffff:10.0.0.7` is `10.0.0.7`), so an ACL written
    either way applies.
    InvalidAclError for anything else: a host name would never match, and a DENY that never
    matches fails open."""
    if host == WILDCARD:
        return host
    if "%" in host:
        # (A client's scope id is dropped before it is compared: `fe80::1` names it on any link.)
        raise InvalidAclError(f"the host {host!r} has a scope id: write the address without it")
    try:
        address = ipaddress.ip_address(host)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)  # an IPv4 client of a dual-stack socket, as Java names it
        return address.compressed
    except ValueError:
        raise InvalidAclError(f"the host must be an IP address or '*', got {host!r}") from None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls select: ANY and None (for names) match everything."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> None:
        """InvalidAclError for a filter that can match nothing Kafka would store."""
        for field_name, value in (
            ("resource type", self.resource_type),
            ("pattern type", self.pattern),
            ("operation", self.operation),
            ("permission", self.permission),
        ):
            if value.name == "UNKNOWN":
                raise InvalidAclError(f"the filter's {field_name} is UNKNOWN")

    def matches(self, acl: Acl) -> bool:
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if not self._matches_pattern(acl):
            return False
        return (
            self.principal in (None, acl.principal)
            and self.host in (None, acl.host)
            and self.operation in (Operation.ANY, acl.operation)
            and self.permission in (Permission.ANY, acl.permission)
        )

    def _matches_pattern(self, acl: Acl) -> bool:
        if self.pattern is PatternType.MATCH:
            # Every ACL that applies to the named resource (no name: every ACL).
            return self.name is None or acl.applies_to(self.name)
        if self.pattern not in (PatternType.ANY, acl.pattern):
            return False
        return self.name in (None, acl.name)


class AclSet:
    """Every ACL of a root, indexed for decisions. Immutable: a change makes a new set."""

    def __init__(self, acls: Iterable[Acl]):
        self.acls: tuple[Acl, ...] = tuple(sorted(set(acls)))
        # By resource type: literal ACLs by name, prefixed ones by prefix, and the lengths of
        # the prefixes (a name is looked up once per length, however many prefixes there are).
        self._literal: dict[ResourceType, dict[str, list[Acl]]] = {t: {} for t in ResourceType}
        self._prefixed: dict[ResourceType, dict[str, list[Acl]]] = {t: {} for t in ResourceType}
        for acl in self.acls:
            by_name = self._prefixed if acl.pattern is PatternType.PREFIXED else self._literal
            by_name[acl.resource_type].setdefault(acl.name, []).append(acl)
        self._prefix_lengths = {t: sorted({len(p) for p in self._prefixed[t]}) for t in ResourceType}
        # Decisions made, by (principal, host, operation, type, name): the set never
        # changes, so neither do they. Bounded: cleared when full.
        self._decided: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}
        self._decided_chars = 0

    def __len__(self) -> int:
        return len(self.acls)

    def _applying(self, resource_type: ResourceType, name: str) -> Iterable[Acl]:
        literal = self._literal[resource_type]
        yield from literal.get(name, ())
        if name != WILDCARD:
            yield from literal.get(WILDCARD, ())
        prefixed = self._prefixed[resource_type]
        for length in self._prefix_lengths[resource_type]:
            if length > len(name):
                break
            yield from prefixed.get(name[:length], ())

    def allows(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """Whether `principal` from `host` may do `operation` on the resource (deny wins)."""
        key = (principal, host, operation, resource_type, name)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(principal, host, operation, resource_type, name)
            chars = len(principal) + len(host) + len(name)
            if chars <= MAX_CACHED_NAME_CHARS // 64:  # (a longer name is decided afresh each time)
                if (
                    len(self._decided) >= MAX_DECISIONS_CACHED
                    or self._decided_chars + chars > MAX_CACHED_NAME_CHARS
                ):
                    self._decided.clear()
                    self._decided_chars = 0
                self._decided[key] = decided
                self._decided_chars += chars
        return decided

    def _decide(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        granting = (operation, Operation.ALL, *_IMPLIED_BY.get(operation, ()))
        allowed = False
        for acl in self._applying(resource_type, name):
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                continue
            if acl.permission is Permission.DENY:
                if acl.operation in (operation, Operation.ALL):
                    return False
            elif acl.operation in granting:
                allowed = True
        return allowed

    def allows_any(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether some resource of `resource_type` allows `operation`: an ALLOW whose pattern
        no matching DENY covers wholly (a DENY of `*`, of the same name, or of a prefix of it)."""

        def mine(acl: Acl, *operations: Operation) -> bool:
            return (
                acl.resource_type is resource_type
                and acl.principal in (principal, WILDCARD_PRINCIPAL)
                and acl.host in (host, WILDCARD)
                and acl.operation in operations
            )

        relevant = [acl for acl in self.acls if mine(acl, operation, Operation.ALL)]
        denies = [acl for acl in relevant if acl.permission is Permission.DENY]
        return any(
            acl.permission is Permission.ALLOW and not any(_covers(deny, acl) for deny in denies)
            for acl in relevant
        )

    def selected(self, selector: AclFilter) -> list[Acl]:
        return [acl for acl in self.acls if selector.matches(acl)]


def _covers(deny: Acl, allow: Acl) -> bool:
    """Whether every resource `allow` names is also named by `deny`."""
    if deny.pattern is PatternType.LITERAL:
        return deny.name == WILDCARD or (allow.pattern is PatternType.LITERAL and allow.name == deny.name)
    return allow.name.startswith(deny.name) and allow.name != WILDCARD
