"""The controller's runtime: asyncio around the pure event step. Decisions are never made
here: every event goes through `controller.core.step`.

Where things go: the driver (`driver`, `committer`, `events`, `loading`) steps events and
makes their records durable; the service (`service`) owns the role and leadership
(`election`, `standby`, `dead_active` on an etcd log) and puts the parts together; a
listener (`frame_listener`: metactl's frames; a Kafka-protocol listener goes beside it)
turns a wire into requests, has them admitted by the admission policy (`admission`:
authorization, the mutation quota and cap, with `quota` and `request_caps`) and answered
by the API handlers (`apis`, `admin_apis`; reads in `describe`, `admin_views`,
`quorum`); `inspections` asks brokers for unclean recovery; `metrics`,
`partition_gauges` and `metrics_server` are the Prometheus side; `serve` is the process.
"""
