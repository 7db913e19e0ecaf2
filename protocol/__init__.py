"""The protocol layer: a sans-IO codec (frames, one message set, version check), one
frame server over a reusable admission (TLS, pending pool, limits: `admission`, for any
listener), and one reconnecting client, shared by the controller, brokers and CLI."""
