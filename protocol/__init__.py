"""The protocol layer: a sans-IO codec (frames, one message set, version check), one
server loop and one reconnecting client, shared by the controller, brokers and CLI."""
