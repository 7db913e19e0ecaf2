"""Clients of a running cluster, as Kafka's `clients` module: how a tool reaches the
controller (controller.py: one request, its TLS identity and retries; admin.py: paged
describes and reassignments; quorum.py: every controller's account of the quorum) and
the brokers' data plane (data.py: leaders and connections; producer.py; consumer.py).

Used by the CLI, the local cluster's supervisor, the chaos runner, tests and benchmarks.
They speak the wire protocol only: they must not import the CLI (`ops`), the servers
(`controller`, `brokers_stub`), the local cluster or the chaos runner.
"""
