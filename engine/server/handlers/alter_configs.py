"""AlterConfigs (API 33, v0-2) and IncrementalAlterConfigs (44, v0-1): a topic's configs,
under Kafka's names (oncelog.server.topic_configs), stored with one durable commit
(LogManager.replace_topic_config) before the answer; the topic's open logs follow at once.

- AlterConfigs replaces every override the topic has with the ones it names (Kafka's
  rule: a config it does not name goes back to its default); IncrementalAlterConfigs
  applies SET, DELETE, APPEND and SUBTRACT to them one by one.
- A name this server does not know, a value it cannot take, or a setting it does not
  have (log compaction, replication) is INVALID_CONFIG with a message: nothing is
  applied for that resource, and nothing is ever ignored silently. The same key twice in
  one resource is INVALID_REQUEST.
- The broker's configs are read-only (INVALID_CONFIG); an unknown topic is
  UNKNOWN_TOPIC_OR_PARTITION; another resource type INVALID_REQUEST.
- validate_only checks everything and stores nothing.
- Authorization, as Kafka's: AlterConfigs on the topic (TOPIC_AUTHORIZATION_FAILED) or on
  the cluster for the broker (CLUSTER_AUTHORIZATION_FAILED), after the request's shape is
  checked (a key named twice).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.errors import error_code_for
from oncelog.server.handlers.describe_configs import config_refusal
from oncelog.server.topic_configs import InvalidConfigError, altered, checked, overrides_of

TOPIC, BROKER = 2, 4
# From a topic's current overrides, its new ones (InvalidConfigError if it cannot be done).
_Change = Callable[[Mapping[str, Any]], dict[str, Any]]


async def handle_alter_configs(broker: Broker, request: Request) -> Any:
    def change_of(resource: Any) -> _Change:
        pairs = [(each.name, each.value) for each in resource.configs]
        return lambda current: overrides_of(pairs)

    return await _answer(broker, request, change_of)


async def handle_incremental_alter_configs(broker: Broker, request: Request) -> Any:
    def change_of(resource: Any) -> _Change:
        steps = [(each.name, each.config_operation, each.value) for each in resource.configs]
        return lambda current: altered(current, steps)

    return await _answer(broker, request, change_of)


async def _answer(broker: Broker, request: Request, change_of: Callable[[Any], _Change]) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    answer_type = nested(response, "responses")
    answers = []
    access = broker.access(request)
    for resource in body.resources:
        code, message = _refusal(broker, access, resource)
        if code == ErrorCode.none:
            apply = functools.partial(
                _apply, broker, resource.resource_name, change_of(resource), body.validate_only
            )
            code, message = await broker.in_thread(apply)
        answers.append(
            build(
                answer_type,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, responses=tuple(answers))


def _refusal(broker: Broker, access: Access, resource: Any) -> tuple[ErrorCode, str | None]:
    """Why a resource's change is refused before it is looked at, or (none, None)."""
    names = [each.name for each in resource.configs]
    if len(set(names)) != len(names):
        return ErrorCode.invalid_request, "a config is named more than once for one resource"
    denied = config_refusal(access, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name)
    if denied is not None:
        return denied, "the principal may not alter these configs"
    if resource.resource_type == BROKER:
        return ErrorCode.invalid_config, "this server's broker configs are set at its start and read-only"
    if resource.resource_type != TOPIC:
        return ErrorCode.invalid_request, f"resource type {resource.resource_type} has no configs here"
    if resource.resource_name not in broker.topics():
        return ErrorCode.unknown_topic_or_partition, f"no topic {resource.resource_name!r}"
    return ErrorCode.none, None


def _apply(broker: Broker, topic: str, change: _Change, validate_only: bool) -> tuple[ErrorCode, str | None]:
    """Work out and store (unless `validate_only`) a topic's new overrides: in a worker thread."""
    manager = broker.manager
    try:
        overrides = change(manager.topic_overrides(topic))
        checked(manager.config, overrides)
        if not validate_only:
            manager.replace_topic_config(topic, overrides)
    except InvalidConfigError as exc:
        return ErrorCode.invalid_config, str(exc)
    except OncelogError as exc:
        return error_code_for(exc), str(exc)
    return ErrorCode.none, None
