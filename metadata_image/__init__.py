"""The metadata image: what replaying the metadata log gives, and what changed.

`state` holds the state types (brokers, topics, partitions), `image` the immutable
cluster image over them (its partitions in `partition_map`), `replay` is the only code
that changes it (returning the next image and a `MetadataDelta`; the `builder` it works
on holds the bulk partition paths, `record_replay` what each other record does),
`delta` describes one replay's changes for everyone downstream, `transactions` replays
the committed log, and `snapshot` converts an image to and from its records and its
snapshot form. Pure: no IO, no clock, no asyncio. Used by the controller, the brokers,
the simulators and the audits alike.
"""
