"""The controller: pure KIP-966 rules over an immutable cluster image, and its driver.

Pure parts (image, replay, handlers, partition changes, recovery policies) are
synchronous, typed and free of IO and clock reads. Only `driver` touches asyncio and
the metadata log.
"""
