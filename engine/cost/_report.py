"""The cost model's public results: ``CostReport``, ``MemoryReport``, ``CollectiveCost``.

Frozen records with ``to_json``; what ``CostModel.evaluate`` returns and what the search,
the plan files, the CLI and the explorer read. Pricing side (what it returns): imports only
``_kinds``.
"""

from __future__ import annotations

import collections
import dataclasses

from ._kinds import CollectiveKind


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveCost:
    kind: CollectiveKind  # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    axes: tuple[str, ...]
    bytes: float  # per device, one execution: the larger of the buffer before/after
    count: int  # executions per step (ops x trips)
    time: float  # seconds per step, all executions
    op: int  # a representative op
    source: str
    cause: str  # the group (named dimension) responsible
    ops: tuple[int, ...] = ()  # every op of the pattern (one execution each per trip)
    operand: int = -1  # the operand resharded (-1: a result or a reduction)
    # seconds per step it runs under compute that does not wait for it (hardware.overlap:
    # a weight gathered ahead of its use, a gradient reduced while the backward pass goes on)
    hidden: float = 0.0

    @property
    def exposed(self) -> float:
        """Seconds per step the step waits for it."""
        return self.time - self.hidden


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryReport:
    """A plan's predicted memory per device, in bytes: the peak (arguments and outputs whole,
    as XLA reports them, plus the temporaries' peak, less what donation aliases), its parts,
    a breakdown by kind at the peak, and with detail what is live there."""

    peak: float  # arguments + outputs + peak temporaries - aliased
    arguments: float
    outputs: float
    temporaries: float  # peak of the intermediates
    alias: float
    breakdown: dict  # parameters, optimizer, activations, temporaries (at the peak)
    # with detail: the op at which the temporaries peak (-1: not computed), and what is
    # live there, largest first
    peak_op: int = -1
    held: tuple["HeldBuffer", ...] = ()
    # host memory per device the step holds at its peak (offloaded values, parameters or
    # optimizer state kept on the host); not part of ``peak``, which is the device's
    host: float = 0.0
    host_offloaded: float = 0.0  # the part of ``host`` that is offloaded intermediates (at their peak)


@dataclasses.dataclass(frozen=True, slots=True)
class HeldBuffer:
    """A buffer live at the predicted peak: a value (``value`` >= 0) or one the plan adds."""

    bytes: float  # per device
    start: int  # the op that makes it ...
    stop: int  # ... and the op before which it is freed
    kind: str  # "value", "buffer" (a reshard's copy, a partial result), "recomputed copy",
    #            "recomputation temporaries", "region array", "device copy" (of state kept in host memory)
    value: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class CostReport:
    """A plan's predicted step: seconds (compute, communication, hidden under compute), MFU,
    memory per device against the budget and whether it fits, and with detail every
    collective (``CostModel.evaluate``)."""

    step_time: float
    compute_time: float
    comm_time: float
    ideal_time: float  # total FLOPs / (devices x peak)
    mfu: float  # ideal_time / step_time
    memory: MemoryReport
    budget: float
    fits: bool
    collectives: tuple[CollectiveCost, ...] = ()
    # of comm_time, the seconds that overlap compute (0 where hardware.overlap is off):
    # step_time = compute_time + comm_time - hidden_time
    hidden_time: float = 0.0

    @property
    def exposed_time(self) -> float:
        """Communication seconds the step waits for (not hidden under compute)."""
        return self.comm_time - self.hidden_time

    @property
    def collective_bytes(self) -> dict[str, float]:
        """Bytes per device each collective kind moves in one step (bytes x count, summed)."""
        out: dict[str, float] = collections.defaultdict(float)
        for c in self.collectives:
            out[c.kind] += c.bytes * c.count
        return dict(out)

    def to_json(self) -> dict:
        """The report as JSON data (``partex search --json``'s, a plan file's ``predicted``)."""
        m = self.memory
        return {
            "step_time_s": self.step_time, "compute_time_s": self.compute_time,
            "comm_time_s": self.comm_time, "comm_exposed_s": self.exposed_time,
            "comm_hidden_s": self.hidden_time, "ideal_time_s": self.ideal_time, "mfu": self.mfu,
            "memory": {"peak": m.peak, "arguments": m.arguments, "outputs": m.outputs,
                       "temporaries": m.temporaries, "alias": m.alias, **{f"breakdown_{k}": v for k, v in m.breakdown.items()}},
            "budget": self.budget, "fits": self.fits,
            "collective_bytes": self.collective_bytes,
        }
