"""The operator's messages to the controller (admin tools, `metactl`): topics,
partitions, configs, features, reassignments, elections, unregistration, and the
describe calls (DescribeCluster with its partition states, DescribeQuorum).

Data only: no IO, no rules.
"""

# ruff: noqa: RUF012 (a default of [] on a msgspec Struct is a fresh list each time; ruff
# sees no Struct because `Msg` is defined in another module)

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from protocol.messages.base import Msg
from protocol.messages.broker_controller import ReplicaRef


class RecoverySummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A partition's most recent unclean recovery, as DescribeCluster shows it: what the
    UncleanRecoveryRecord says, and when it was committed."""

    chosen: int
    strategy: str
    trigger: str = ""
    candidates: list[int] = []  # the replicas whose logs were compared
    at_ms: int  # commit time (the controller's clock)
    age_ms: int  # how long before the answer
    offline_since_ms: int | None = None


class PartitionState(Msg, tag="PartitionState", frozen=True):
    """One partition's committed state, as the wire reports it."""

    topic: str
    partition: int
    replicas: list[int]
    leader: int  # -1: none
    leader_epoch: int
    partition_epoch: int
    isr: list[int]
    elr: list[int] = []
    last_known_elr: list[int] = []
    recovering: bool = False
    recovery_pending: list[int] | None = None
    min_isr: int = 1
    # DescribeCluster: the last unclean recovery within the request's window. Omitted when
    # there is none; an older receiver ignores it, so no new version.
    last_unclean_recovery: RecoverySummary | None = None
    # A reassignment in progress (KIP-455): the replicas being added (in `replicas`, the
    # target's new ones) and being removed (the original's leaving ones). Omitted when
    # empty; an older receiver ignores them, so no new version.
    adding_replicas: list[int] = []
    removing_replicas: list[int] = []


# --- operator -> controller -------------------------------------------------------------


class CreateTopic(Msg, tag="CreateTopic", frozen=True):
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    assignments: list[list[int]] | None = None  # explicit placement, one list per partition
    min_isr: int | None = msgspec.field(default=None, name="min_insync_replicas")
    recovery_strategy: str | None = msgspec.field(default=None, name="unclean_recovery_strategy")
    # Drawn by the controller's driver for every create (a client's value is replaced):
    # ids are random, so a topic created again under the same name is a different topic.
    topic_id: str | None = None


class CreateTopicsRequest(Msg, tag="CreateTopics", frozen=True):
    topics: list[CreateTopic]


class CreateTopicResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    error_code: str | None = None
    message: str = ""
    topic_id: str | None = None
    assignments: list[list[int]] | None = None


class CreateTopicsResponse(Msg, tag="CreateTopicsResponse", frozen=True):
    results: list[CreateTopicResult]


class DeleteTopic(Msg, tag="DeleteTopic", frozen=True):
    """One topic to delete (the core's event; DeleteTopicsRequest carries several)."""

    name: str


class DeleteTopicsRequest(Msg, tag="DeleteTopics", frozen=True):
    topics: list[str]


class TopicResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One topic's outcome in a response that names several."""

    name: str
    error_code: str | None = None
    message: str = ""
    topic_id: str | None = None


class DeleteTopicsResponse(Msg, tag="DeleteTopicsResponse", frozen=True):
    results: list[TopicResult]


class DeleteTopicResponse(Msg, tag="DeleteTopicResponse", frozen=True):
    name: str
    topic_id: str


class CreatePartitions(Msg, tag="CreatePartitions", frozen=True):
    """Grow a topic to `count` partitions (kafka-topics --alter --partitions); the new
    partitions are placed as at create unless `assignments` gives one list each."""

    topic: str
    count: int
    assignments: list[list[int]] | None = None


class CreatePartitionsRequest(Msg, tag="CreatePartitionsBatch", frozen=True):
    topics: list[CreatePartitions]


class CreatePartitionsResponse(Msg, tag="CreatePartitionsResponse", frozen=True):
    results: list[CreateTopicResult]


class ConfigEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    value: str | None
    # DYNAMIC_TOPIC_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG
    source: str
    read_only: bool = False


class AlterConfigs(Msg, tag="IncrementalAlterConfigs", frozen=True):
    """Set and delete dynamic configs of one resource (kafka-configs --alter):
    `resource_type` "topic" with the topic's name, or "broker" with an empty name for
    the cluster default (--entity-default)."""

    resource_type: str
    resource_name: str
    set_configs: dict[str, str] = {}
    delete_configs: list[str] = []


class AlterConfigsResponse(Msg, tag="IncrementalAlterConfigsResponse", frozen=True):
    resource_type: str
    resource_name: str
    # How many topics' ELRs and LastKnownELRs the change cleared (KIP-966): 1 for a
    # topic's config, every topic for the cluster default.
    cleared_topics: int = 0


class DescribeConfigsRequest(Msg, tag="DescribeConfigs", frozen=True):
    resource_type: str
    resource_name: str


class DescribeConfigsResponse(Msg, tag="DescribeConfigsResponse", frozen=True):
    resource_type: str
    resource_name: str
    configs: list[ConfigEntry]


class FeatureLevel(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    min_version: int
    max_version: int
    finalized: int | None = None  # None: not finalized (the controller's flag applies)
    effective: int = 0


class UpdateFeature(Msg, tag="UpdateFeatures", frozen=True):
    """kafka-features upgrade|downgrade: finalize `name` at `level`."""

    name: str
    level: int
    upgrade_type: Literal["upgrade", "downgrade"] = "upgrade"


class UpdateFeatureResponse(Msg, tag="UpdateFeaturesResponse", frozen=True):
    name: str
    level: int
    cleared_topics: int = 0


class DescribeFeaturesRequest(Msg, tag="DescribeFeatures", frozen=True):
    pass


class DescribeFeaturesResponse(Msg, tag="DescribeFeaturesResponse", frozen=True):
    features: list[FeatureLevel]


class Reassignment(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    replicas: list[int] | None  # None: cancel the partition's reassignment


class AlterPartitionReassignments(Msg, tag="AlterPartitionReassignments", frozen=True):
    """KIP-455: set (or with `replicas` None, cancel) target replicas. Each partition
    succeeds or fails alone, as in Kafka."""

    reassignments: list[Reassignment]


class ReassignmentResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    error_code: str | None = None
    message: str = ""


class AlterPartitionReassignmentsResponse(
    Msg, tag="AlterPartitionReassignmentsResponse", frozen=True
):
    results: list[ReassignmentResult]


class ListPartitionReassignmentsRequest(Msg, tag="ListPartitionReassignments", frozen=True):
    """v1: every partition being reassigned (of `topics`, if set) in one answer, refused
    with MESSAGE_TOO_LARGE when that does not fit a frame. v2: one page (docs/protocol.md,
    ListPartitionReassignments): up to `limit` partitions from `cursor` on (in (topic,
    partition) order), within `max_bytes`. The v2 fields are ignored at v1."""

    VERSIONS: ClassVar[frozenset[int]] = frozenset({1, 2})
    topics: list[str] | None = None  # None: every partition being reassigned
    cursor: DescribeCursor | None = None  # v2: the first partition to look at; None: the first
    limit: int | None = None  # v2: most partitions in the page; None: the controller's page size
    # v2: the largest frame payload the sender accepts; the controller also keeps to its own.
    max_bytes: int | None = None


class OngoingReassignment(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]


class ListPartitionReassignmentsResponse(
    Msg, tag="ListPartitionReassignmentsResponse", frozen=True
):
    """Answered at the request's version, from one committed image."""

    VERSIONS: ClassVar[frozenset[int]] = frozenset({1, 2})
    reassignments: list[OngoingReassignment]
    # v2: where the next page starts looking; None: nothing more (always None at v1). A
    # page may hold fewer partitions than asked (even none) and still have a next one.
    next_cursor: DescribeCursor | None = None


class UnregisterBroker(Msg, tag="UnregisterBroker", frozen=True):
    broker_id: int


class ElectLeader(Msg, tag="ElectLeaders", frozen=True):
    topic: str
    partition: int
    election_type: Literal["preferred", "unclean"]
    replica: int | None = None  # required for unclean


class ElectPreferredLeaders(Msg, tag="ElectPreferredLeaders", frozen=True):
    """Move leadership back to each partition's preferred (first) replica wherever it is
    an active ISR member: `partitions` (None: every partition), as Kafka's ElectLeaders
    with election type PREFERRED and a null partition list. The controller works through
    them a work budget per event, each piece committed on its own (as KRaft balances
    leaders), so heartbeats and writes go on between pieces."""

    partitions: list[ReplicaRef] | None = None


class ElectionFailure(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    error_code: str


class ElectPreferredLeadersResponse(Msg, tag="ElectPreferredLeadersResponse", frozen=True):
    elected: int = 0
    not_needed: int = 0  # led by the preferred replica already
    not_available: int = 0  # the preferred replica is not an active ISR member
    unknown: int = 0  # partitions named that do not exist
    # The first failures (not_available and unknown), at most MAX_ELECTION_FAILURES.
    failures: list[ElectionFailure] = []


class DescribeCursor(msgspec.Struct, frozen=True, kw_only=True):
    """A place in DescribeCluster's partition order (topic name, then partition index):
    the first partition a page holds (KIP-966 DescribeTopicPartitions' Cursor)."""

    topic: str
    partition: int


class DescribeClusterRequest(Msg, tag="DescribeCluster", frozen=True):
    """v1: every broker and every partition (of `topic`, if set) in one answer, refused
    with MESSAGE_TOO_LARGE when that does not fit a frame; an unknown topic answers no
    partitions. v2: one page (docs/protocol.md, Paging): up to `partition_limit`
    partitions from `cursor` on and `broker_limit` brokers from id `broker_cursor` on,
    within `max_bytes`; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION, a negative
    limit, cursor or `max_bytes` INVALID_REQUEST (checked by the service, as the core
    checks its requests). The v2 fields are ignored at v1."""

    VERSIONS: ClassVar[frozenset[int]] = frozenset({1, 2})
    topic: str | None = None
    cursor: DescribeCursor | None = None  # None: from the first partition
    # None: the controller's page size; 0: no partitions (e.g. `metactl brokers`).
    partition_limit: int | None = None
    broker_cursor: int | None = None  # the first broker id to return; None: the lowest
    broker_limit: int | None = None  # as partition_limit
    # The largest frame payload the sender accepts; the controller also keeps to its own.
    max_bytes: int | None = None
    # Show a partition's last unclean recovery if it is at most this old (None: 24 h, 0:
    # never). An older controller ignores it and shows none.
    recoveries_within_ms: int | None = None


class BrokerDescription(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    epoch: int
    fenced: bool
    controlled_shutdown: bool
    last_registration_clean: bool
    last_heartbeat_age_ms: int | None
    endpoint: str
    rack: str | None
    # Why a fenced broker is fenced, when the controller saw it happen: the fence's
    # reason ("session_timeout", ...) or "registered" (fenced until it catches up). An
    # older receiver ignores it; an older controller sends none.
    fenced_reason: str | None = None


class TopicDescription(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A topic's summary, as `kafka-topics.sh --describe` prints it above its partitions."""

    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    min_isr: int
    recovery_strategy: str | None = None  # None: the cluster's default


class DescribeClusterResponse(Msg, tag="DescribeClusterResponse", frozen=True):
    """Answered at the request's version, from one committed image."""

    VERSIONS: ClassVar[frozenset[int]] = frozenset({1, 2})
    brokers: list[BrokerDescription]
    partitions: list[PartitionState]
    end_offset: int
    committed_offset: int
    # v2: where the next page starts; None: nothing more (always None at v1).
    next_cursor: DescribeCursor | None = None
    next_broker_cursor: int | None = None
    # The topics the page's partitions belong to, in page order. Omitted when empty; an
    # older receiver ignores it, so no new version.
    topics: list[TopicDescription] = []


class DescribeQuorumRequest(Msg, tag="DescribeQuorum", frozen=True):
    """What this controller knows of the controller quorum (`kafka-metadata-quorum
    describe`): answered by any controller, active or standby, never redirected. With
    `etcd_members`, also each etcd member's own status (one status call per member, each
    bounded by a second)."""

    etcd_members: bool = False


class EtcdMemberState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One etcd member as it reports itself."""

    name: str
    client_url: str
    healthy: bool
    leader: bool = False  # the Raft leader
    raft_role: str = ""  # "leader", "follower", "no leader"; "" if it did not answer
    member_id: str = ""  # hex, as etcdctl prints it
    raft_index: int | None = None
    raft_term: int | None = None
    version: str = ""
    error: str = ""  # why it is not healthy: no answer, no leader known, an alarm


class RegisteredController(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A controller of an etcd log as it last recorded itself there (its own clock's
    epoch ms): listed even once gone, with when it was last seen."""

    node_id: str
    address: str
    started_ms: int = 0
    last_seen_ms: int = 0


class DescribeQuorumResponse(Msg, tag="DescribeQuorumResponse", frozen=True):
    """One controller's view of the quorum. Offsets are the log's: `applied_offset` is
    the offset after the last record this controller has applied (a standby's tailing
    image, read records of an open transaction included; the active controller's
    committed log end), `log_end_offset` the committed log end it knows. The term is the
    etcd leadership key's create revision (the fencing token); a single controller on a
    SQLite log has no term."""

    cluster_id: str
    node_id: str  # --node-id, else the advertised address
    address: str  # the advertised address
    role: str  # "active", "standby", "starting"
    backend: str  # "sqlite", "etcd", "memory"
    log: str  # where the log is: its path or etcd URL
    applied_offset: int
    log_end_offset: int
    leader_id: str | None = None  # the active controller's node id, when one is known
    leader_address: str | None = None
    term: int | None = None
    leader_since_ms: int | None = None  # when the active controller took over (epoch ms)
    lease_ttl_s: int | None = None
    # Why no controller is known to be active (an election under way, etcd lost quorum).
    leader_problem: str | None = None
    etcd_members: list[EtcdMemberState] = []
    etcd_error: str | None = None  # the members' status could not be read
    # Every controller recorded in etcd (`metadata_log.etcd.registry`), so the tool can ask
    # those it was not given. Empty on SQLite, from an older controller, or if etcd did
    # not say (`controllers_error`); an older receiver ignores both, so no new version.
    controllers: list[RegisteredController] = []
    controllers_error: str | None = None


# --- broker -> controller: a client's admin request, forwarded ---------------------------

# What a broker may forward in an Envelope: the admin requests of Kafka's admin APIs.
EnvelopedRequest = (
    CreateTopicsRequest
    | DeleteTopicsRequest
    | CreatePartitionsRequest
    | DescribeConfigsRequest
    | AlterConfigs
    | ElectLeader
    | ElectPreferredLeaders
    | AlterPartitionReassignments
    | ListPartitionReassignmentsRequest
    | DescribeClusterRequest
    | UpdateFeature
    | DescribeFeaturesRequest
)


class Envelope(Msg, tag="Envelope", frozen=True):
    """A client's admin request that a broker's Kafka listener forwards to the controller,
    as Kafka's brokers forward to the KRaft controller (KIP-590's Envelope): accepted only
    from a broker (`broker-<id>`); the inner request is then authorized and handled as if
    `principal` had sent it (None: the client had no certificate, under --insecure), its
    mutation quota charged to that principal (or, without one, to `client_address`'s
    host). The answer is the inner request's, unchanged (an error as ErrorResponse)."""

    principal: str | None
    request: EnvelopedRequest
    client_address: str = ""  # HOST:PORT of the client's connection to the broker
