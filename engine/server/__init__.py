"""`oncelog serve`: a single-node Kafka wire-protocol front end over a LogManager root.

Unmodified Kafka clients (librdkafka, kafka-python, aiokafka) produce idempotently
and transactionally into it, fetch from it and commit offsets in consumer groups.
Requests and responses are encoded by kio, which is generated from Kafka's JSON
message specs; record batches pass through as the bytes the client sent and the
bytes stored on disk.

The wire:
- `codec`: framing, request headers and bodies decoded, responses encoded (kio)
- `fallback`: what kio cannot do (unknown tagged fields, versions older than its specs), by kafka-python
- `frame_bounds`: each length and count in a request checked against its frame before kio allocates it
- `api_registry`: every API served, in one table: key, versions, handler, fallbacks (ApiVersions)
- `handlers`: one module per API or family of APIs, from a decoded request to a response body:
  `produce`, `fetch`, `list_offsets`, `metadata`, `find_coordinator`, `create_topics`,
  `groups` (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch),
  `transactions` (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit),
  `group_admin` (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete),
  `cluster_admin` (DeleteRecords, DescribeCluster, DescribeLogDirs), `describe_configs`,
  `alter_configs` (AlterConfigs, IncrementalAlterConfigs), `topic_admin` (DeleteTopics, CreatePartitions),
  `producer_admin` (DescribeProducers, ListTransactions, DescribeTransactions),
  `sasl` (SaslHandshake, SaslAuthenticate),
  `scram_admin` (DescribeUserScramCredentials, AlterUserScramCredentials),
  `acls` (DescribeAcls, CreateAcls, DeleteAcls)
- `errors`: the server's exceptions, and oncelog's as Kafka error codes

The state behind the APIs:
- `broker`: the LogManager, topics, the cluster id, append wake-ups, the coordinators
- `group_coordinator`, `group_state`: consumer groups (membership, rebalances, offsets)
- `group_admin`: what an operator asks of the groups (list, describe, delete, delete offsets)
- `topic_configs`: Kafka's topic config names and the LogConfig fields behind them, and the broker's
- `txn_coordinator`, `txn_state`: transactional ids, epochs, the two-phase end of a transaction
- `marker_syncs`: a transaction end's markers fsynced after its completion is stored
- `coordinator_store`: what both coordinators keep across restarts

Security:
- `listeners`: where the server listens, each listener's security protocol and advertised address
- `tls`: the SSL listeners' context, and a client certificate's principal
- `sasl`: a connection's security state and its SASL login (PLAIN, SCRAM-SHA-256/512)
- `security_store`: the root's store of credentials and ACLs, which only the server's user can read
- `credentials`: the SASL users' SCRAM credentials
- `acls`: Kafka's ACL model: ACLs, filters, and the allow/deny decision
- `acl_store`: the root's ACLs, stored durably and read again when any process changes them
- `authorization`: a request's principal and host against the ACLs, for every handler

The process:
- `connection`: one client connection: bounded reads, requests answered in order
- `unsent`: the bytes held for responses not yet taken, under one budget
- `memory_reuse`: freed fetch buffers kept for the next fetch (glibc's malloc thresholds)
- `rate_limited_log`: warnings a client can repeat at will, once a minute per topic or address
- `app`: the asyncio server, SIGTERM draining and the recovery summary

Logs go to the `oncelog.server` logger.
"""
