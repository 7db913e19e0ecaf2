"""The controller's pure core: the KIP-966 rules as one event step.

`step` decides an event against the image (handlers, partition changes, recovery
policies), replays the records it produced and evaluates pending recoveries, returning
records, response, next state, inspections to send and the delta. Synchronous, typed,
with no IO, no asyncio and no clock reads: time comes in as an argument. It must not
import `controller.runtime`.
"""
