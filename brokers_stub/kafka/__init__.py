"""The broker's Kafka listener (`--kafka-listen`): Kafka's own wire protocol, for real
Kafka clients and tools (librdkafka, `kcat`, the Java AdminClient). Issue 32, slice 1:
ApiVersions, Metadata and DescribeTopicPartitions, answered from the broker's metadata
image (docs/kafka.md has the API and version table and the differences from Kafka).

- `framing`: Kafka's size-prefixed frames, the request header and the kio entities of
  each API version; what a frame is (a request, an API not served, a malformed frame);
- `apis`: the answers, built from a `ClusterImage` (pure: no IO);
- `listener`: `KafkaListener`, the serve loop of an established connection, admitted by
  `protocol.admission` exactly as the broker's own listener admits its connections.
"""
