"""Every API `oncelog serve` answers, in one table: key, versions, handler and fallbacks.

A row holds what the server needs of one API:
- `advertised`: the range ApiVersions lists, always from 0, since librdkafka before
  2.11.1 enables features by exact-version overlap (KAFKA-18659);
- `served`: the versions decoded (by kio) and handed to `handler`; an advertised
  version below it is refused entry by entry with UNSUPPORTED_VERSION, built by
  `unsupported` (kio's specs start where Kafka 4 does: Produce v3, Fetch v4,
  ListOffsets v1, OffsetCommit v2, OffsetFetch v1, CreateTopics v2);
- `fallback_request`: kafka-python's request class, which decodes a frame carrying
  tagged fields kio's spec lacks (librdkafka's Metadata v9), for kio to decode again.

ApiVersions is answered here: its answer is this table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kio.schema.errors import ErrorCode

from oncelog.server import fallback
from oncelog.server.broker import Broker
from oncelog.server.codec import (
    API_VERSIONS_KEY,
    NO_THROTTLE,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
    Request,
    build,
    nested,
    response_type,
)
from oncelog.server.handlers.acls import handle_create_acls, handle_delete_acls, handle_describe_acls
from oncelog.server.handlers.alter_configs import handle_alter_configs, handle_incremental_alter_configs
from oncelog.server.handlers.cluster_admin import (
    handle_delete_records,
    handle_describe_cluster,
    handle_describe_log_dirs,
)
from oncelog.server.handlers.create_topics import handle_create_topics
from oncelog.server.handlers.describe_configs import handle_describe_configs
from oncelog.server.handlers.fetch import handle_fetch
from oncelog.server.handlers.find_coordinator import handle_find_coordinator
from oncelog.server.handlers.group_admin import (
    handle_delete_groups,
    handle_describe_groups,
    handle_list_groups,
    handle_offset_delete,
)
from oncelog.server.handlers.groups import (
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_offset_commit,
    handle_offset_fetch,
    handle_sync_group,
)
from oncelog.server.handlers.list_offsets import handle_list_offsets
from oncelog.server.handlers.metadata import handle_metadata
from oncelog.server.handlers.produce import handle_produce
from oncelog.server.handlers.producer_admin import (
    handle_describe_producers,
    handle_describe_transactions,
    handle_list_transactions,
)
from oncelog.server.handlers.sasl import handle_sasl_authenticate, handle_sasl_handshake
from oncelog.server.handlers.scram_admin import (
    handle_alter_user_scram_credentials,
    handle_describe_user_scram_credentials,
)
from oncelog.server.handlers.topic_admin import handle_create_partitions, handle_delete_topics
from oncelog.server.handlers.transactions import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_end_txn,
    handle_init_producer_id,
    handle_txn_offset_commit,
)

# A handler returns a body to encode, None (no response: acks=0), or a Frame it built
# and counted itself (a fetch's).
Handler = Callable[[Broker, Request], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    advertised: tuple[int, int]
    served: tuple[int, int]
    handler: Handler
    fallback_request: Any | None = None
    unsupported: fallback.UnsupportedAnswer | None = None

    def serves(self, version: int) -> bool:
        return self.served[0] <= version <= self.served[1]

    def advertises(self, version: int) -> bool:
        return self.advertised[0] <= version <= self.advertised[1]


async def handle_api_versions(broker: Broker, request: Request) -> Any:
    """Every advertised range; a version this server does not know gets a v0 body with error 35."""
    version = request.api_version if request.body is not None else 0
    code = ErrorCode.none if request.body is not None else ErrorCode.unsupported_version
    response = response_type(API_VERSIONS_KEY, version)
    key_type = nested(response, "api_keys")
    keys = tuple(
        build(key_type, api_key=api.key, min_version=api.advertised[0], max_version=api.advertised[1])
        for api in APIS.values()
    )
    return build(response, error_code=code, api_keys=keys, throttle_time=NO_THROTTLE)


def _api(
    key: int,
    name: str,
    handler: Handler,
    max_version: int,
    served_min: int = 0,
    *,
    fallback_request: Any | None = None,
    unsupported: fallback.UnsupportedAnswer | None = None,
) -> Api:
    return Api(key, name, (0, max_version), (served_min, max_version), handler, fallback_request, unsupported)


APIS: Final[Mapping[int, Api]] = {
    api.key: api
    for api in (
        _api(
            0, "Produce", handle_produce, 9, 3, fallback_request=ProduceRequest, unsupported=fallback.PRODUCE
        ),
        _api(1, "Fetch", handle_fetch, 12, 4, fallback_request=FetchRequest, unsupported=fallback.FETCH),
        _api(
            2,
            "ListOffsets",
            handle_list_offsets,
            7,
            1,
            fallback_request=ListOffsetsRequest,
            unsupported=fallback.LIST_OFFSETS,
        ),
        _api(3, "Metadata", handle_metadata, 9, fallback_request=MetadataRequest),
        _api(8, "OffsetCommit", handle_offset_commit, 9, 2, unsupported=fallback.OFFSET_COMMIT),
        _api(9, "OffsetFetch", handle_offset_fetch, 9, 1, unsupported=fallback.OFFSET_FETCH),
        _api(10, "FindCoordinator", handle_find_coordinator, 6, fallback_request=FindCoordinatorRequest),
        _api(11, "JoinGroup", handle_join_group, 7),
        _api(12, "Heartbeat", handle_heartbeat, 4),
        _api(13, "LeaveGroup", handle_leave_group, 5),
        _api(14, "SyncGroup", handle_sync_group, 5),
        _api(15, "DescribeGroups", handle_describe_groups, 5),
        _api(16, "ListGroups", handle_list_groups, 5),
        _api(SASL_HANDSHAKE_KEY, "SaslHandshake", handle_sasl_handshake, 1),
        _api(API_VERSIONS_KEY, "ApiVersions", handle_api_versions, 4, fallback_request=ApiVersionsRequest),
        _api(
            19,
            "CreateTopics",
            handle_create_topics,
            5,
            2,
            fallback_request=CreateTopicsRequest,
            unsupported=fallback.CREATE_TOPICS,
        ),
        _api(20, "DeleteTopics", handle_delete_topics, 6, 1, unsupported=fallback.DELETE_TOPICS),
        _api(21, "DeleteRecords", handle_delete_records, 2),
        _api(22, "InitProducerId", handle_init_producer_id, 4, fallback_request=InitProducerIdRequest),
        _api(24, "AddPartitionsToTxn", handle_add_partitions_to_txn, 3),
        _api(25, "AddOffsetsToTxn", handle_add_offsets_to_txn, 3),
        _api(26, "EndTxn", handle_end_txn, 3),
        _api(28, "TxnOffsetCommit", handle_txn_offset_commit, 3),
        _api(29, "DescribeAcls", handle_describe_acls, 3, 1, unsupported=fallback.DESCRIBE_ACLS),
        _api(30, "CreateAcls", handle_create_acls, 3, 1, unsupported=fallback.CREATE_ACLS),
        _api(31, "DeleteAcls", handle_delete_acls, 3, 1, unsupported=fallback.DELETE_ACLS),
        _api(32, "DescribeConfigs", handle_describe_configs, 4, 1, unsupported=fallback.DESCRIBE_CONFIGS),
        _api(33, "AlterConfigs", handle_alter_configs, 2),
        _api(35, "DescribeLogDirs", handle_describe_log_dirs, 4, 1, unsupported=fallback.DESCRIBE_LOG_DIRS),
        _api(SASL_AUTHENTICATE_KEY, "SaslAuthenticate", handle_sasl_authenticate, 2),
        _api(37, "CreatePartitions", handle_create_partitions, 3),
        _api(42, "DeleteGroups", handle_delete_groups, 2),
        _api(44, "IncrementalAlterConfigs", handle_incremental_alter_configs, 1),
        _api(47, "OffsetDelete", handle_offset_delete, 0),
        _api(50, "DescribeUserScramCredentials", handle_describe_user_scram_credentials, 0),
        _api(51, "AlterUserScramCredentials", handle_alter_user_scram_credentials, 0),
        _api(60, "DescribeCluster", handle_describe_cluster, 1),
        _api(61, "DescribeProducers", handle_describe_producers, 0),
        _api(65, "DescribeTransactions", handle_describe_transactions, 0),
        _api(66, "ListTransactions", handle_list_transactions, 1),
    )
}
