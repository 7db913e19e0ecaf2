"""The maintenance pre-flight (issue 34): what a broker's restart would do, and in which
order every broker can be restarted, answered by the controller's own rules.

Nothing here decides anything by rules of its own. A plan steps a *copy* of an image
through the one core step (`controller.core.step`, as the driver does) with the events
the restart would cause: a controlled shutdown (or, for a crash, the fence a session
timeout causes), the broker's registration again (clean, or unclean without its epoch),
the heartbeat that unfences it, and the leaders' AlterPartitions that take it back into
their ISRs (`planning.whatif`); then it compares the partitions before and after
(`planning.restart`, `planning.roll`). The image is immutable, so the copy costs nothing
and the original is never touched.

Pure: no IO, no clock (time comes in as `now_ms`), no asyncio, no threads. Imports the
controller core, the image package and the messages the core steps and answers (the
wire's message types, as the core's handlers do); never the controller runtime, the CLI,
the simulators or any store (import-linter, pyproject.toml).
"""
