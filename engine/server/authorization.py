"""Whether a request may do what it asks: its principal and host against the root's ACLs.

Authorization is on when the server can tell clients apart or has been told who may
do what: a listener authenticates (SASL, or SSL with client certificates), `--super-user`
names someone, or the root has ever held an ACL (acl_store). Otherwise every client is
allowed everything, as a Kafka broker without an authorizer allows it; `serve` refuses to
run that way on a public address without `--allow-anonymous`.

Each request is decided against the ACLs current when it is handled (`Authorizer.access`),
so a change takes effect at every connection's next request. Handlers ask `Access` and
answer a denial with Kafka's error for it, where Kafka puts it.
"""

from __future__ import annotations

from typing import Any, Final

from oncelog.server.acl_store import AclStore
from oncelog.server.acls import CLUSTER_NAME, AclSet, Operation, ResourceType
from oncelog.server.tls import ANONYMOUS


class Access:
    """What one request's principal, from its host, may do."""

    __slots__ = ("_acls", "host", "principal")

    def __init__(self, principal: str, host: str, acls: AclSet | None):
        self.principal = principal
        self.host = host
        self._acls = acls  # None: everything is allowed (no authorization, or a super user)

    @property
    def enforced(self) -> bool:
        return self._acls is not None

    def allows(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return self._acls is None or self._acls.allows(
            self.principal, self.host, operation, resource_type, name
        )

    def topic(self, operation: Operation, name: str) -> bool:
        return self.allows(operation, ResourceType.TOPIC, name)

    def group(self, operation: Operation, name: str) -> bool:
        return self.allows(operation, ResourceType.GROUP, name)

    def transactional_id(self, operation: Operation, name: str) -> bool:
        return self.allows(operation, ResourceType.TRANSACTIONAL_ID, name)

    def cluster(self, operation: Operation) -> bool:
        return self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def any_of_type(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: some resource of the type allows `operation`."""
        return self._acls is None or self._acls.allows_any(
            self.principal, self.host, operation, resource_type
        )

    def operations(self, resource_type: ResourceType, name: str, operations: tuple[Operation, ...]) -> int:
        """Kafka's authorized-operations bit field: bit N set if operation N is allowed."""
        return sum(1 << int(op) for op in operations if self.allows(op, resource_type, name))

    def may_create_topic(self, name: str) -> bool:
        """Create on the cluster or on the topic, as CreateTopics and auto-creation need."""
        return self.cluster(Operation.CREATE) or self.topic(Operation.CREATE, name)


OPEN: Final = Access(ANONYMOUS, "", None)


class Authorizer:
    """Hands each request its Access: the ACLs as they stand, or everything for a super user."""

    def __init__(
        self,
        store: AclStore,
        super_users: tuple[str, ...],
        authenticates: bool,
    ):
        self.store = store
        self.super_users = frozenset(super_users)
        # Whether some listener names its clients (SASL, client certificates).
        self._authenticates = authenticates

    def enforced(self) -> bool:
        return self._enforced(self.store.current()[1])

    def _enforced(self, ever_had_acls: bool) -> bool:
        return self._authenticates or bool(self.super_users) or ever_had_acls

    def access(self, session: Any, host: str) -> Access:
        principal = getattr(session, "principal", ANONYMOUS)
        if principal in self.super_users:
            return Access(principal, host, None)
        acls, ever_had_acls = self.store.current()
        if not self._enforced(ever_had_acls):
            return Access(principal, host, None)
        return Access(principal, host, acls)
