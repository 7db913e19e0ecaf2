"""The metadata image: what replaying the metadata log gives, and what changed.

`image` holds the immutable cluster image, `replay` is the only code that changes it
(returning the next image and a `MetadataDelta`), `delta` describes one replay's
changes for everyone downstream, and `snapshot` converts an image to and from its
snapshot form. Pure: no IO, no clock, no asyncio. Used by the controller, the brokers,
the simulators and the audits alike.
"""
