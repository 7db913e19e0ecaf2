"""Simulators that drive the controller's one event step: the YAML scenario runner and
the seeded long-history simulator. Neither has rules of its own."""
