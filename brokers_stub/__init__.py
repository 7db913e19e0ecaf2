"""The stub broker: a lightweight broker process for exercising the controller service.

It registers, heartbeats, tails the metadata log into a local image, accepts Produce
from clients as a leader, and replicates with leader-epoch histories and offsets
instead of record bytes, so that clean and unclean shutdowns, ISR changes, unclean
recovery and the loss of acknowledged records can be driven end to end.
Modules: config, storage, replica_log, replication (pure decisions), replica_manager
(follows the image and hands the work to its parts: replica_files, the logs and their
files; replica_lifecycle, which replicas exist; leader_side, leading and serving
followers; follower_side, fetching and applying the answers),
produce (the data plane: Produce, ReadLog, acks=all waiters),
leader (a led partition's soft state and its AlterPartition requests), fetcher (the
fetch loops), metadata (tails the log with `metadata_image.replay.apply` and hands on
each delta), broker (the process, serving on `protocol.server`), cli, metrics, logctx.
The lower modules see the replica manager and the broker only through the small
protocols they declare (`fetcher.FetchHost`, `produce.LedReplicas`,
`leader_side.ReplicaView`, `metrics.BrokerState`). The protocol
client is `protocol.client`; the image and its deltas come from `metadata_image`.
"""
