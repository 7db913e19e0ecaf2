"""Kafka's own wire protocol, shared by the brokers' and the controller's Kafka listeners.

Pure parts (framing, record batches, producer state, the metadata answers built from an
image, the admin translation to metactl's messages) and the one serve loop
(`listener`). It frames Kafka's wire with kio; it must not import metactl's own frames
(`protocol.codec`, `protocol.server`, `protocol.client`).
"""
