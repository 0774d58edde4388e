"""DescribeUserScramCredentials (API 50) and AlterUserScramCredentials (API 51), KIP-554.

Kafka asks Describe, and Alter, on the cluster for these (authorization: a super user, or
an ACL); any other principal gets CLUSTER_AUTHORIZATION_FAILED and nothing changes. An
upsertion carries the salted password (the client salts and iterates): the server keeps
only the keys derived from it.

Per user, as Kafka answers: an unknown user is RESOURCE_NOT_FOUND; a user named twice in
one request DUPLICATE_RESOURCE (and nothing of it is applied); an unknown mechanism
UNSUPPORTED_SASL_MECHANISM; iterations outside 4096..16384, an empty name or a salt under
12 bytes UNACCEPTABLE_CREDENTIAL; deleting a credential the user does not have
RESOURCE_NOT_FOUND. A user's changes are all checked before any of them is applied.
"""

from __future__ import annotations

import collections
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.server.acls import Operation
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.credentials import (
    SCRAM_MECHANISMS,
    CredentialError,
    ScramCredential,
    check_user_name,
    credential_from_salted,
)

# Kafka's ScramMechanism ids on the wire (0 is UNKNOWN).
MECHANISM_IDS: Final = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
_MECHANISM_NAMES: Final = {number: name for name, number in MECHANISM_IDS.items()}


async def handle_describe_user_scram_credentials(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    # None or empty: every user (as Kafka reads it; librdkafka sends an empty array).
    asked = [user.name for user in request.body.users] if request.body.users else None
    if not broker.access(request).cluster(Operation.DESCRIBE):
        return _describe_refused(response, result_type, asked)
    info_type = nested(result_type, "credential_infos")
    known = await broker.in_thread(lambda: dict(broker.credentials.users()))
    counts = collections.Counter(asked or ())
    results = []
    for name in sorted(known) if asked is None else asked:
        message: str | None
        if counts[name] > 1:
            code, message, infos = ErrorCode.duplicate_resource, f"user {name!r} is named more than once", ()
        elif name not in known:
            code, message, infos = ErrorCode.resource_not_found, f"no SCRAM credentials for user {name!r}", ()
        else:
            code, message = ErrorCode.none, None
            infos = tuple(
                build(info_type, mechanism=MECHANISM_IDS[mechanism], iterations=iterations)
                for mechanism, iterations in known[name].items()
            )
        results.append(
            build(result_type, user=name, error_code=code, error_message=message, credential_infos=infos)
        )
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )


def _describe_refused(response: Any, result_type: Any, asked: list[str] | None) -> Any:
    """Kafka refuses with the request's error. For named users each one's result carries it
    instead: confluent-kafka 2.x's Python binding crashes (SIGSEGV) on a request-level error
    when it named users, as it would against Kafka."""
    message = "the principal may not describe SCRAM credentials (it needs Describe on the cluster)"
    refused = ErrorCode.cluster_authorization_failed
    results = tuple(
        build(result_type, user=name, error_code=refused, error_message=message, credential_infos=())
        for name in dict.fromkeys(asked or ())
    )
    code, text = (ErrorCode.none, None) if asked else (refused, message)
    return build(response, throttle_time=NO_THROTTLE, error_code=code, error_message=text, results=results)


async def handle_alter_user_scram_credentials(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    body = request.body
    names = list(dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions]))
    if not broker.access(request).cluster(Operation.ALTER):
        message = "the principal may not change SCRAM credentials (it needs Alter on the cluster)"
        return build(
            response,
            throttle_time=NO_THROTTLE,
            results=tuple(
                build(
                    result_type,
                    user=name,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message=message,
                )
                for name in names
            ),
        )
    plans = {name: _plan(name, body) for name in names}
    outcomes = await broker.in_thread(
        lambda: {name: _apply(broker, name, plan) for name, plan in plans.items()}
    )
    results = tuple(
        build(result_type, user=name, error_code=code, error_message=message)
        for name, (code, message) in outcomes.items()
    )
    return build(response, throttle_time=NO_THROTTLE, results=results)


# What one user's changes come to: (deletions, upsertions) by mechanism, or the error that refuses them all.
_Plan = tuple[list[str], dict[str, ScramCredential]] | tuple[ErrorCode, str]


def _plan(name: str, body: Any) -> _Plan:
    deletions = [d.mechanism for d in body.deletions if d.name == name]
    upsertions = [u for u in body.upsertions if u.name == name]
    mechanisms = deletions + [u.mechanism for u in upsertions]
    if len(mechanisms) != len(set(mechanisms)):
        return ErrorCode.duplicate_resource, f"a mechanism of user {name!r} is changed more than once"
    unknown = [m for m in mechanisms if m not in _MECHANISM_NAMES]
    if unknown:
        return (
            ErrorCode.unsupported_sasl_mechanism,
            f"unknown SCRAM mechanism id {unknown[0]} (1: SHA-256, 2: SHA-512)",
        )
    try:
        check_user_name(name)
        credentials = {
            _MECHANISM_NAMES[u.mechanism]: credential_from_salted(
                _MECHANISM_NAMES[u.mechanism], u.salt, u.salted_password, u.iterations
            )
            for u in upsertions
        }
    except CredentialError as exc:
        return ErrorCode.unacceptable_credential, str(exc)
    return [_MECHANISM_NAMES[m] for m in deletions], credentials


def _apply(broker: Broker, name: str, plan: _Plan) -> tuple[ErrorCode, str | None]:
    if isinstance(plan[0], ErrorCode):
        return plan[0], str(plan[1])
    deletions, upsertions = plan
    assert isinstance(deletions, list) and isinstance(upsertions, dict)
    store = broker.credentials
    missing = [m for m in deletions if store.scram(name, m) is None]
    if missing:
        return ErrorCode.resource_not_found, f"user {name!r} has no {missing[0]} credentials to delete"
    for mechanism in deletions:
        store.delete(name, mechanism)
    for mechanism, credential in upsertions.items():
        assert mechanism in SCRAM_MECHANISMS
        store.put(name, mechanism, credential)
    return ErrorCode.none, None
