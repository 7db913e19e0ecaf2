"""The controller's runtime: the asyncio driver around the pure event step, the TCP
service with broker sessions, metrics and the clock. Decisions are never made here:
every event goes through `controller.core.step`.
"""
