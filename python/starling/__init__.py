"""Starling's Python client: a thin layer over `peer serve`, which does
the networking (discovery, private swarms, all-reduce, compression, state
sync, fault handling). Tensors move through shared memory.

    import starling
    with starling.Client.start() as c:            # runs `peer serve --once`
        c.join(["--swarm", "lab", "--min-peers", "3"])
        c.allreduce([t1, t2])                      # in place: the mean over the swarm

starling.train has a DDP-style GradAverager and a DiLoCo outer optimizer
(they need torch; this module needs only numpy).
"""

from .client import Client, StarlingError, find_peer

__all__ = ["Client", "StarlingError", "find_peer"]
