"""The etcd backend of the metadata log: the log on a Raft-replicated store, and the lease
that elects the one controller allowed to append to it (docs/ha.md).

`client` wraps the etcd client library (one gRPC channel to every endpoint, deadlines,
errors mapped to metactl's); `lease` is leadership (campaign, keep-alive, resign);
`store` is `EtcdLogStore`, a `LogStore` backend whose appends are fenced by leadership.
Importing this package loads the etcd client library, so only `metadata_log.backends`
(on an ``etcd://`` URL) and the controller's HA runtime import it.
"""
