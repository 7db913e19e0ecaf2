"""How a controller takes part in an etcd log's election (docs/ha.md): `HaSettings`.

Read by the service (`controller.runtime.service`), its campaign
(`controller.runtime.election`) and DescribeQuorum (`controller.runtime.quorum`). Data
only: nothing here talks to etcd.
"""

from __future__ import annotations

from dataclasses import dataclass

from metadata_log.etcd import DEFAULT_LEASE_TTL_S
from metadata_log.etcd.tls import EtcdTls

__all__ = ["HaSettings"]


@dataclass(frozen=True)
class HaSettings:
    """How a controller takes part in an etcd log's election (docs/ha.md)."""

    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    advertised_listener: str | None = None  # HOST:PORT clients are sent to; default: bound
    node_id: str | None = None  # the name in the leadership key; default: the address
    cluster_id: str | None = None  # checked against the log's (or given to a new log)
    etcd_tls: EtcdTls | None = None  # TLS to etcd (--etcd-cacert/--etcd-cert/--etcd-key)
    # A standby that finds the active controller's listener refusing connections ends
    # its term rather than wait out the TTL (controller.runtime.dead_active).
    dead_active_detection: bool = True
