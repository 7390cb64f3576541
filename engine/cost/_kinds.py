"""The collective kinds: the one list partex predicts and reads back from XLA's HLO.

Owns ``CollectiveKind`` (a ``str`` enum: each member equals, hashes and prints as the
name XLA gives the op, so a member and its string are interchangeable as dict keys and in
JSON) and ``KINDS`` (every kind's name, in report order). Shared by both sides (building
and pricing); imports nothing of partex: the HLO parser and the verifier import it as well
as the cost model.
"""

from __future__ import annotations

import enum


class CollectiveKind(enum.StrEnum):
    # sums (or max, min, ...) partial results over the devices of the axes; every device
    # ends with the whole reduced buffer: a ring passes the data twice (reduce, then gather)
    ALL_REDUCE = "all-reduce"
    # every device ends with the concatenation of all devices' blocks (an axis dropped)
    ALL_GATHER = "all-gather"
    # the reduction of partial results, each device keeping only its block of the result
    REDUCE_SCATTER = "reduce-scatter"
    # every device sends a block to each other one: a sharded dim moved to another dim
    ALL_TO_ALL = "all-to-all"
    # point to point: halo rows of neighbours, blocks reordered between devices
    COLLECTIVE_PERMUTE = "collective-permute"
    # not a collective: a copy between a device's memory and its host's (an offloaded value
    # going out or coming back), over the host link; XLA runs it asynchronously
    HOST_TRANSFER = "host-transfer"

    @property
    def ring_passes(self) -> int:
        """How often the ring (alpha-beta) model sends the (n-1)/n share of the bytes and
        pays the per-hop latency: twice for an all-reduce, once for the others."""
        return _RING_PASSES[self]


_RING_PASSES = {CollectiveKind.ALL_REDUCE: 2}
_RING_PASSES.update({k: 1 for k in CollectiveKind if k not in _RING_PASSES})

# every collective's name, in report order (plain strings: what the HLO parser and the
# verifier key on); a host transfer is not among them
KINDS: tuple[str, ...] = tuple(k.value for k in CollectiveKind if k is not CollectiveKind.HOST_TRANSFER)
