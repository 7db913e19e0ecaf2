"""The broker's side of Kafka's wire protocol (`--kafka-listen`), for real Kafka clients
and tools (librdkafka, aiokafka, `kcat`). docs/kafka.md has the API and version table
and every difference from Kafka.

- `apis`: which APIs the broker serves and who answers each (the framing, the serve
  loop and the metadata answers are `protocol.kafka`'s, shared with the controller);
- `data`: the data APIs' dispatch, authorization and Produce; `fetch`: Fetch and its
  long poll; `offsets`: ListOffsets, OffsetForLeaderEpoch, InitProducerId and
  FindCoordinator's refusal; `host`: what they need of the replica manager, and the
  leader-epoch rules they share;
- `forward`: the admin APIs, forwarded to the controller in envelopes.
"""
