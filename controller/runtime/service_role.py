"""What the service's parts read of its role: `ServiceRole`, the part of
`controller.runtime.service.ControllerService` they share.

The API handlers (`apis.ServingRole`), DescribeQuorum (`quorum.QuorumView`) and the
election (`election.RoleChanges`) each extend it with what they alone need, so that none
of them imports the service: the service imports them. An interface only: no state, no
behaviour.
"""

from __future__ import annotations

from typing import Protocol

from controller.runtime.standby import Standby
from metadata_image.image import ClusterImage
from metadata_log.store import LogStore

__all__ = ["ServiceRole"]


class ServiceRole(Protocol):
    """A controller service's role, as its parts read it."""

    @property
    def role(self) -> str:
        """starting, standby or active."""
        ...

    @property
    def acting(self) -> bool:
        """Active, and (on etcd) still sure of its leadership: checked per request."""
        ...

    @property
    def replicated(self) -> bool:
        """Whether the log is on etcd (several controllers take turns)."""
        ...

    @property
    def advertised(self) -> str:
        """The address clients are sent to, and the leadership key names."""
        ...

    @property
    def store(self) -> LogStore | None:
        """The writer's store while active."""
        ...

    @property
    def standby(self) -> Standby | None:
        """The tailing image a standby answers reads from (etcd logs)."""
        ...

    @property
    def last_image(self) -> ClusterImage | None:
        """The last term's committed image, after stepping down, until a standby."""
        ...
