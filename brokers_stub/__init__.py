"""The stub broker: a lightweight broker process for exercising the controller service.

It registers, heartbeats, tails the metadata log into a local image, accepts Produce
from clients as a leader (metactl's own, which sends counts, and Kafka clients', whose
record batches are stored as they came), and replicates leader-epoch histories, offsets
and those bytes, so that clean and unclean shutdowns, ISR changes, unclean recovery and
the loss of acknowledged records can be driven end to end, with real Kafka clients too.
Modules: config, storage, replica_log (a replica's state and epoch history),
replica_bytes (its Kafka batches and their file), replication (pure decisions),
replica_manager
(follows the image and hands the work to its parts: replica_files, the logs and their
files; replica_lifecycle, which replicas exist; leader_side, leading and serving
followers; follower_side, fetching and applying the answers),
produce (the data plane: Produce, ReadLog, acks=all waiters),
leader (a led partition's soft state and its AlterPartition requests), fetcher (the
fetch loops), metadata (tails the log with `metadata_image.replay.apply` and hands on
each delta), broker (the process, serving on `protocol.server`), kafka (the Kafka
listener's APIs: `brokers_stub/kafka/`), cli, metrics, logctx.
The lower modules see the replica manager and the broker only through the small
protocols they declare (`fetcher.FetchHost`, `produce.LedReplicas`,
`leader_side.ReplicaView`, `metrics.BrokerState`). The protocol
client is `protocol.client`; the image and its deltas come from `metadata_image`.
"""
