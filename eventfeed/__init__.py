"""The event feed: the committed metadata log as one readable line per event, online
(from a running controller) or offline (from a log), for `metactl events` and `metactl
cluster up`'s foreground.

`feed.py` turns committed entries into `Event`s, a metadata transaction whole, keeping
the image they build; `view.py` is the state a line is told against; `lines.py` words
one record; `follow.py` tails a controller's committed log through a feed.

It reads and words records; it prints nothing, and must not import the CLI (`ops`).
"""
