"""DescribeAcls (API 29), CreateAcls (API 30) and DeleteAcls (API 31), v1-3.

Kafka asks Describe on the cluster for DescribeAcls and Alter on the cluster for the
other two; a principal without it gets CLUSTER_AUTHORIZATION_FAILED (DescribeAcls at the
top, the others in each creation or filter result) and nothing changes. An ACL Kafka
would not store (a resource type or pattern it cannot hold, no operation, a principal
that is not TYPE:NAME, a cluster not named kafka-cluster) is INVALID_REQUEST in its own
result, with the reason; the valid ones of the request are stored together, in one
commit. DeleteAcls removes what all its filters match in one commit, and lists per
filter what it removed. A change takes effect at every connection's next request.

A server that does not authorize (no listener names its clients, no --super-user, and
the root has never held an ACL) answers all three SECURITY_DISABLED and stores nothing, as
Kafka without an authorizer does: otherwise the first anonymous client to call CreateAcls
would decide, for good, who may do what. The first ACLs of such a root come from
`oncelog acls ROOT add`.

v0 (literal patterns only, no pattern type on the wire) is advertised and answered
UNSUPPORTED_VERSION, as Kafka 4 answers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.server.acl_store import TooManyAclsError
from oncelog.server.acls import (
    Acl,
    AclFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    check_acl,
    normal_host,
    normal_host_filter,
)
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type

_DISABLED = (
    "this server does not authorize requests (no listener authenticates its clients, no --super-user, "
    "no ACLs): add the first ACLs with `oncelog acls ROOT add`"
)


def _refusal(broker: Broker, request: Request, operation: Operation) -> tuple[ErrorCode, str] | None:
    """SECURITY_DISABLED on a server that does not authorize, CLUSTER_AUTHORIZATION_FAILED for a
    principal without `operation` on the cluster, or None."""
    if not broker.authorizer.enforced():
        return ErrorCode.security_disabled, _DISABLED
    if not broker.access(request).cluster(operation):
        verb = "describe" if operation is Operation.DESCRIBE else "change"
        needed = operation.name.title()
        message = f"the principal may not {verb} the cluster's ACLs (it needs {needed} on the cluster)"
        return ErrorCode.cluster_authorization_failed, message
    return None


def _enum(kind: Callable[[int], Any], value: int, unknown: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return unknown


def _filter_of(entry: Any) -> AclFilter:
    return AclFilter(
        _enum(ResourceType, entry.resource_type_filter, ResourceType.UNKNOWN),
        entry.resource_name_filter,
        _enum(PatternType, entry.pattern_type_filter, PatternType.UNKNOWN),
        entry.principal_filter,
        normal_host_filter(entry.host_filter),
        _enum(Operation, entry.operation, Operation.UNKNOWN),
        _enum(Permission, entry.permission_type, Permission.UNKNOWN),
    )


async def handle_describe_acls(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    resource_type = nested(response, "resources")
    description_type = nested(resource_type, "acls")

    def answer(code: ErrorCode, message: str | None, resources: tuple[Any, ...] = ()) -> Any:
        return build(
            response, throttle_time=NO_THROTTLE, error_code=code, error_message=message, resources=resources
        )

    refusal = _refusal(broker, request, Operation.DESCRIBE)
    if refusal is not None:
        return answer(*refusal)
    selector = _filter_of(request.body)
    try:
        selector.check()
    except InvalidAclError as exc:
        return answer(ErrorCode.invalid_request, str(exc))
    acls, _ = await broker.in_thread(broker.authorizer.store.current)
    by_resource: dict[tuple[int, str, int], list[Any]] = {}
    for acl in acls.selected(selector):
        key = (int(acl.resource_type), acl.name, int(acl.pattern))
        by_resource.setdefault(key, []).append(
            build(
                description_type,
                principal=acl.principal,
                host=acl.host,
                operation=int(acl.operation),
                permission_type=int(acl.permission),
            )
        )
    resources = tuple(
        build(
            resource_type, resource_type=kind, resource_name=name, pattern_type=pattern, acls=tuple(entries)
        )
        for (kind, name, pattern), entries in by_resource.items()
    )
    return answer(ErrorCode.none, None, resources)


async def handle_create_acls(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    creations = request.body.creations
    results: list[tuple[ErrorCode, str | None]]
    refusal = _refusal(broker, request, Operation.ALTER)
    if refusal is not None:
        results = [refusal] * len(creations)
    else:
        results = await _create(broker, creations)
    return build(
        response,
        throttle_time=NO_THROTTLE,
        results=tuple(
            build(result_type, error_code=code, error_message=message) for code, message in results
        ),
    )


async def _create(broker: Broker, creations: Any) -> list[tuple[ErrorCode, str | None]]:
    results: list[tuple[ErrorCode, str | None]] = []
    valid: list[Acl] = []
    for creation in creations:
        try:
            acl = Acl(
                _enum(ResourceType, creation.resource_type, ResourceType.UNKNOWN),
                creation.resource_name,
                _enum(PatternType, creation.resource_pattern_type, PatternType.UNKNOWN),
                creation.principal,
                normal_host(creation.host),  # (as requests name their hosts: `0:0:0:0:0:0:0:1` is `::1`)
                _enum(Operation, creation.operation, Operation.UNKNOWN),
                _enum(Permission, creation.permission_type, Permission.UNKNOWN),
            )
            check_acl(acl)
        except InvalidAclError as exc:
            results.append((ErrorCode.invalid_request, str(exc)))
            continue
        valid.append(acl)
        results.append((ErrorCode.none, None))
    if valid:
        try:
            await broker.in_thread(lambda: broker.authorizer.store.add(valid))
        except TooManyAclsError as exc:
            return [
                (ErrorCode.invalid_request, str(exc)) if code == ErrorCode.none else (code, message)
                for code, message in results
            ]
    return results


async def handle_delete_acls(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "filter_results")
    matching_type = nested(result_type, "matching_acls")
    filters = [_filter_of(entry) for entry in request.body.filters]

    def result(code: ErrorCode, message: str | None, acls: list[Acl]) -> Any:
        matching = tuple(
            build(
                matching_type,
                error_code=ErrorCode.none,
                error_message=None,
                resource_type=int(acl.resource_type),
                resource_name=acl.name,
                pattern_type=int(acl.pattern),
                principal=acl.principal,
                host=acl.host,
                operation=int(acl.operation),
                permission_type=int(acl.permission),
            )
            for acl in acls
        )
        return build(result_type, error_code=code, error_message=message, matching_acls=matching)

    refusal = _refusal(broker, request, Operation.ALTER)
    if refusal is not None:
        results = [result(*refusal, []) for _ in filters]
    else:
        invalid: dict[int, str] = {}
        for index, selector in enumerate(filters):
            try:
                selector.check()
            except InvalidAclError as exc:
                invalid[index] = str(exc)
        valid = [selector for index, selector in enumerate(filters) if index not in invalid]
        removed = iter(await broker.in_thread(lambda: broker.authorizer.store.remove(valid)) if valid else [])
        results = [
            result(ErrorCode.invalid_request, invalid[index], [])
            if index in invalid
            else result(ErrorCode.none, None, next(removed))
            for index in range(len(filters))
        ]
    return build(response, throttle_time=NO_THROTTLE, filter_results=tuple(results))
