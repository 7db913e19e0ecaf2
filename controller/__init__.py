"""The controller: pure KIP-966 rules over an immutable cluster image, and its runtime.

`controller.core` is the pure part (the event step, the handlers, partition changes,
recovery policies): synchronous, typed and free of IO and clock reads. Only
`controller.runtime` touches asyncio, the network and the metadata log.
"""
