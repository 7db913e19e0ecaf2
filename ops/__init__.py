"""The `metactl` command line: thin commands over the log, the core and the services.

Commands parse arguments, call into the other packages and print. They hold no rules
of their own.
"""
