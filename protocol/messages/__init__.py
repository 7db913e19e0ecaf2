"""Every message of metactl, as versioned msgspec Structs: one class per concept, one
module per pair of parties.

The controller core decides over these (RegisterBroker, AlterPartition, ElectLeader, …),
the wire carries them unchanged, and the scenario runner and tests build them directly:

- `base`: `Msg`, what every message is, and `ErrorResponse`, the answer any request may
  get instead of its own;
- `broker_controller`: brokers and the controller (registration, heartbeats,
  AlterPartition, the metadata fetch, GetReplicaLogInfo);
- `admin`: the operator's requests to the controller (topics, configs, features,
  reassignments, elections, DescribeCluster, DescribeQuorum);
- `replication`: broker to broker (ReplicaFetch);
- `data`: clients to brokers, the data plane (Produce, ReadLog);
- `internal`: only inside the controller (FenceBroker, UnfenceBroker, ControlledShutdown,
  ReplicaLogInfo and the core's responses);
- `unions`: `Message`, what may travel on the wire, and what the controller's step
  decides over and answers.

Each message has a version `v` (1 unless set) and the versions its receiver accepts in
`VERSIONS`; `protocol.codec.decode_frame` refuses others with UNSUPPORTED_VERSION. Wire
tags and field names are those of docs/protocol.md: where the core's attribute name
differs, the field is renamed on the wire (e.g. RegisterBroker.previous_epoch travels as
`previous_broker_epoch`). A message's wire tag is its own (`tag=`), whichever module
holds it. Data only: no IO, no rules.
"""
