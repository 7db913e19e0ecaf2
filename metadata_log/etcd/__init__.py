"""The etcd backend of the metadata log: the log on a Raft-replicated store, and the
leadership key that elects the one controller allowed to append to it (docs/ha.md).

`client` wraps the etcd client library (deadlines, errors mapped to metactl's), over
`target` (where the log lives: the etcd:// URL), `txn` (compares and ops), `hedging`
(one channel per member: which member a call goes to, hedged or sent once), `channels`
(a member's channel, TLS) and `errors`; `health` is each member's own status; `lease`
is leadership (campaign, heartbeats, resign); `store` is `EtcdLogStore`, a `LogStore`
backend whose appends are fenced by leadership. Importing any of those modules but
`target` loads the etcd client library (and gRPC), so only
`metadata_log.backends` (on an ``etcd://`` URL) and the controller's election import
them, when the log is on etcd. This package itself holds only what the command line
needs without them (`DEFAULT_LEASE_TTL_S`, and `tls`: the `--etcd-cacert/--etcd-cert/
--etcd-key` flags and what they name).
"""

import os
from typing import Final

__all__ = ["DEFAULT_LEASE_TTL_S"]

# gRPC's C core logs its own lines ("Corruption detected", TLS handshake details) on
# stderr, beside metactl's one-line errors that already say what failed. Set here, before
# any module of this package imports gRPC; set GRPC_VERBOSITY=ERROR to see them.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

DEFAULT_LEASE_TTL_S: Final = 2
"""The leadership lease's TTL in seconds unless `--lease-ttl-s` says otherwise."""
