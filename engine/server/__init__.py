"""`oncelog serve`: a single-node Kafka wire-protocol front end over a LogManager root.

Unmodified Kafka clients (librdkafka, kafka-python, aiokafka) produce idempotently
into it and fetch from it. Requests and responses are encoded by kio, which is
generated from Kafka's JSON message specs; record batches pass through as the bytes
the client sent and the bytes stored on disk.

- `protocol`: the API table (advertised and served versions), framing, header and body codec
- `fallback`: what kio cannot do (unknown tagged fields, versions older than its specs), by kafka-python
- `broker`: the state behind the APIs (the LogManager, topics, the cluster id, append wake-ups)
- `cluster`, `produce`, `fetch`, `offsets`: one handler per API, from a decoded request to a response
- `errors`: oncelog's exceptions as Kafka error codes
- `connection`: one client connection: bounded reads, requests answered in order
- `rate_limited_log`: warnings a client can repeat at will, once a minute per topic or address
- `app`: the asyncio server, SIGTERM draining and the recovery summary
"""
