"""DescribeConfigs (API 32, v1-4): a topic's configs (oncelog.server.topic_configs) and the
broker's, as Kafka describes them.

- A topic's: every config of TOPIC_CONFIGS, its override DYNAMIC_TOPIC_CONFIG and the
  root's value DEFAULT_CONFIG; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION.
- The broker's (resource "0", or "" for the defaults): read-only, STATIC_BROKER_CONFIG.
  Another broker id, and any other resource type (broker loggers, groups, client
  metrics), is INVALID_REQUEST with a message.
- `configuration_keys` keeps only the configs named; synonyms (v1+) list the entry, and
  for an override the default under it; v3+ carries each config's type and, when asked,
  its documentation.

Authorization, as Kafka's: DescribeConfigs on the topic (else TOPIC_AUTHORIZATION_FAILED,
whether it exists or not) or on the cluster for the broker (CLUSTER_AUTHORIZATION_FAILED),
in that resource's result, with no configs.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import NODE_ID, Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.topic_configs import (
    BROKER_CONFIGS,
    DEFAULT_CONFIG,
    STATIC_BROKER_CONFIG,
    describe_topic,
)

TOPIC, BROKER = 2, 4
# (name, value, read-only, source, type, documentation) of one config.
_Entry = tuple[str, str, bool, int, int, str]
# A topic config's synonym under it: (broker config name, the root's value).
_Default = tuple[str, str]
_DEFAULT_ENTRY: Final = ""


async def handle_describe_configs(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    config_type = nested(result_type, "configs")
    synonym_type = nested(config_type, "synonyms")
    synonyms_wanted = getattr(body, "include_synonyms", False)
    documentation_wanted = getattr(body, "include_documentation", False)
    results = []
    access = broker.access(request)
    for resource in body.resources:
        refusal = config_refusal(
            access, Operation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name
        )
        code, message, entries, defaults = (
            (refusal, "the principal may not describe these configs", [], {})
            if refusal is not None
            else _describe(broker, resource.resource_type, resource.resource_name)
        )
        keys = resource.configuration_keys
        configs = tuple(
            build(
                config_type,
                name=name,
                value=value,
                read_only=read_only,
                config_source=source,
                is_sensitive=False,
                synonyms=_synonyms(synonym_type, name, value, source, defaults) if synonyms_wanted else (),
                config_type=kind,
                documentation=doc if documentation_wanted else None,
            )
            for name, value, read_only, source, kind, doc in entries
            if not keys or name in keys  # (null or empty: every config, as Kafka reads it)
        )
        results.append(
            build(
                result_type,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=configs,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, results=tuple(results))


def config_refusal(access: Access, operation: Operation, resource_type: int, name: str) -> ErrorCode | None:
    """The error for a topic's or the broker's configs the principal may not `operation`, or None."""
    if resource_type == TOPIC and not access.topic(operation, name):
        return ErrorCode.topic_authorization_failed
    if resource_type == BROKER and not access.cluster(operation):
        return ErrorCode.cluster_authorization_failed
    return None


def _describe(
    broker: Broker, resource_type: int, name: str
) -> tuple[ErrorCode, str | None, list[_Entry], dict[str, _Default]]:
    """(error, message, entries, each topic config's default under it) of one resource."""
    if resource_type == TOPIC:
        if name not in broker.topics():
            return ErrorCode.unknown_topic_or_partition, f"no topic {name!r}", [], {}
        overrides = broker.manager.topic_overrides(name)
        entries = [
            (each.name, value, False, source, each.config_type, each.documentation)
            for each, value, source in describe_topic(broker.manager.topic_config(name), overrides)
        ]
        defaults = {
            each.name: (each.broker_name, value)
            for each, value, _ in describe_topic(broker.manager.config, {})
        }
        return ErrorCode.none, None, entries, defaults
    if resource_type == BROKER:
        if name not in (str(NODE_ID), _DEFAULT_ENTRY):
            return ErrorCode.invalid_request, f"this server is broker {NODE_ID}, not {name!r}", [], {}
        entries = [
            (each.name, each.value(broker), True, STATIC_BROKER_CONFIG, each.config_type, each.documentation)
            for each in BROKER_CONFIGS
        ]
        return ErrorCode.none, None, entries, {}
    return (
        ErrorCode.invalid_request,
        f"resource type {resource_type} is not described here (topics and the broker are)",
        [],
        {},
    )


def _synonyms(
    synonym_type: Any, name: str, value: str, source: int, defaults: dict[str, _Default]
) -> tuple[Any, ...]:
    """Kafka's synonyms of a config: a topic's override, then the broker default under it
    (by the broker config's name); a broker config is its own."""
    found = []
    if source != DEFAULT_CONFIG or name not in defaults:
        found.append(build(synonym_type, name=name, value=value, source=source))
    if name in defaults:
        broker_name, default = defaults[name]
        found.append(build(synonym_type, name=broker_name, value=default, source=DEFAULT_CONFIG))
    return tuple(found)
