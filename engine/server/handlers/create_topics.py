"""CreateTopics (API 19, v2-5): topics of one replica, with their configs under Kafka's
names (oncelog.server.topic_configs: one it cannot take is INVALID_CONFIG, never ignored),
stored before the topic's partitions are made. v5 answers with the topic's configs.

An internal topic (`__consumer_offsets`, `__transaction_state`) is refused with
INVALID_REQUEST, Kafka's answer for its own internal metadata topic
(ControllerApis.createTopics), unless it exists (TOPIC_ALREADY_EXISTS).

Authorization, as Kafka's: Create on the cluster or on the topic, else
TOPIC_AUTHORIZATION_FAILED whether the topic exists or not. Configs are answered only to
a principal that may DescribeConfigs the topic (else the topic's config error is
TOPIC_AUTHORIZATION_FAILED and no configs are listed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, InvalidPartitionsError, TopicExistsError, error_code_for
from oncelog.server.topic_configs import InvalidConfigError, describe_topic, overrides_of

# v5+ answers with each created topic's configs.
CONFIGS_ANSWERED_FROM = 5


async def handle_create_topics(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "topics")
    names = [wanted.name for wanted in body.topics]
    access = broker.access(request)
    topics = []
    for wanted in body.topics:
        if names.count(wanted.name) > 1:
            refusal = ErrorCode.invalid_request, f"the request names topic {wanted.name!r} more than once"
        elif not access.may_create_topic(wanted.name):
            refusal = (
                ErrorCode.topic_authorization_failed,
                "the principal may not create this topic (it needs Create on the cluster or topic)",
            )
        else:
            topics.append(await _create(broker, request, access, topic_type, wanted))
            continue
        code, message = refusal
        topics.append(
            build(
                topic_type,
                name=wanted.name,
                error_code=code,
                error_message=message,
                num_partitions=-1,
                replication_factor=-1,
                configs=None,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _create(broker: Broker, request: Request, access: Access, topic_type: Any, wanted: Any) -> Any:
    """One topic created (or checked, validate_only), and its entry in the answer."""
    count = wanted.num_partitions
    if count == -1:
        count = len(wanted.assignments) or broker.config.partitions
    code, message = ErrorCode.none, None
    overrides: dict[str, Any] = {}
    if wanted.replication_factor not in (-1, 1):
        code = ErrorCode.invalid_replication_factor
        message = f"replication factor {wanted.replication_factor} on a single node; use 1 or -1"
    else:
        try:
            overrides = overrides_of((each.name, each.value) for each in wanted.configs)
            await broker.create_topic(
                wanted.name, count, validate_only=request.body.validate_only, overrides=overrides
            )
        except InternalTopicError as exc:
            code, message = ErrorCode.invalid_request, str(exc)
        except InvalidConfigError as exc:
            code, message = ErrorCode.invalid_config, str(exc)
        except (TopicExistsError, InvalidPartitionsError, InvalidTopicError, OncelogError) as exc:
            code, message = error_code_for(exc), str(exc)
    ok = code == ErrorCode.none
    configs = None
    config_code = ErrorCode.none
    if ok and not access.topic(Operation.DESCRIBE_CONFIGS, wanted.name):
        config_code = ErrorCode.topic_authorization_failed
    elif ok and request.api_version >= CONFIGS_ANSWERED_FROM:
        config_type = nested(topic_type, "configs")
        configs = tuple(
            build(
                config_type,
                name=each.name,
                value=value,
                read_only=False,
                config_source=source,
                is_sensitive=False,
            )
            for each, value, source in describe_topic(
                dataclasses.replace(broker.manager.config, **overrides), overrides
            )
        )
    return build(
        topic_type,
        name=wanted.name,
        error_code=code,
        error_message=message,
        num_partitions=count if ok else -1,
        replication_factor=1 if ok else -1,
        configs=configs,
        topic_config_error_code=config_code,
    )
