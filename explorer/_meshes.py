"""The mesh's shape as a decision in the page: ``partex.Session.search_meshes`` runs in a
forked child (as the page's search does, ``_runner``: it shares neither the GIL nor the
garbage collector with the server's event loop), sends the meshes tried after each round of
its successive halving down a pipe, and the page shows them in the Meshes card
(``MeshesView``), where the user continues on one (``ExplorerState.use_mesh``).

The child's sessions stay in the child: a mesh the user picks gets a new search on the page
that starts from the plan the mesh search found there (``MeshRow.plan``) and its hand plans,
with the pins kept where they apply.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import threading
import traceback

import panel as pn
import param

from partex import MeshTrial, PartexError, Session, Topology, effort_of

from ._format import esc, fmt_bytes, fmt_pct, fmt_time
from ._runner import CHILD_NICENESS, reap, start_forked
from ._tables import Table
from ._widgets import bokeh_update, button, html, keyed, on_change, on_click, select, text_input, tip_left

log = logging.getLogger("partex.explorer")

# a candidate's state (``MeshTrial.status``) in the card's words
STATES = {"open": "open: not reached yet", "scored": "hand plans scored", "searching": "searching",
          "dropped": "dropped", "converged": "searched to convergence", "not reached": "not reached: time was up",
          "time up": "time was up", "stopped": "stopped",
          "left out": "left out: farther from the best meshes than the search's effort reaches"}

DEFAULT_SECONDS = 20  # the form's search time: a few rounds on the tiny demos' meshes
AXES = ("2", "3", "4")  # the most axes a candidate mesh may have
# which pipelined candidates the search adds (``Session.search_meshes(pipelines=...)``)
PIPELINES = {"over the slices": None, "within a slice too": True, "never": False}
DEFAULT_PIPELINES = "over the slices"


@dataclasses.dataclass(frozen=True)
class MeshRow:
    """One mesh tried, as the card shows it."""

    mesh: str  # as the mesh form takes it (each axis's bandwidth where the mesh gives them)
    label: str  # name=size pairs
    hand: float | None  # the best hand plan that fits: seconds (None: none fits)
    step: float | None  # the best plan the search found that fits
    mfu: float | None
    memory: float | None
    simulations: int
    rounds: int
    note: str  # why it was not searched
    status: str  # ``MeshTrial.status``: open, scored, searching, dropped, converged, ...
    pipeline: str = ""  # the pipeline its step runs (``Pipeline.text``), "" for the step as written
    bubble: float | None = None
    tier: int = 0  # its tier of the search: the narrowest space is 0
    plan: tuple[tuple[str, str], ...] = ()  # its best plan, as (label, slot) pairs (``MeshTrial.plan``)

    @classmethod
    def of(cls, t: MeshTrial) -> "MeshRow":
        return cls(t.mesh.text(links=True), t.mesh.text(), t.warm_step, t.step_time, t.mfu, t.memory, t.simulations,
                   t.rounds, t.note, t.status, t.pipeline.text() if t.pipeline else "", t.bubble, t.tier, t.plan)

    @property
    def open(self) -> bool:
        """Still to be searched, or searching."""
        return self.status in ("open", "scored", "searching")

    @property
    def key(self) -> str:
        """What the page's forms take (``ExplorerState.use_mesh``): the mesh, and the pipeline."""
        return self.mesh + (f" | {self.pipeline}" if self.pipeline else "")

    @property
    def name(self) -> str:
        return self.label + (f" | {self.pipeline}" if self.pipeline else "")


@dataclasses.dataclass(frozen=True)
class MeshRequest:
    """What the card's form asks for (checked before a child is forked)."""

    devices: int
    topology: Topology | None
    seconds: float
    max_axes: int
    pipelines: bool | None = None  # None: a stage per slice where there are several; True: within a slice too

    @classmethod
    def parse(cls, devices, topology: str, seconds, max_axes, pipelines: str = DEFAULT_PIPELINES) -> "MeshRequest":
        try:
            n = int(devices)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            raise PartexError(f"give a positive whole number of devices, got {devices!r}", field="devices")
        topo = None
        if (topology or "").strip():
            try:
                topo = Topology.parse(topology)
            except PartexError as e:
                raise PartexError(str(e), field="topology") from None
            if topo.devices != n:
                raise PartexError(f"{topology.strip()!r} holds {topo.devices} devices, not the {n} asked for: the "
                                  f"slices times the devices in each must make {n}", field="topology")
        try:
            secs = float(seconds)
        except (TypeError, ValueError):
            secs = 0.0
        if not secs > 0:
            raise PartexError(f"give a positive number of seconds, got {seconds!r}", field="seconds")
        if pipelines not in PIPELINES:
            raise PartexError(f"pipelines: one of {', '.join(map(repr, PIPELINES))}, got {pipelines!r}",
                              field="pipelines")
        return cls(n, topo, secs, int(max_axes), PIPELINES[pipelines])

    def text(self) -> str:
        where = f" ({self.topology.text()})" if self.topology is not None and self.topology.granules > 1 else ""
        return f"{self.devices} devices{where}"


@dataclasses.dataclass(frozen=True)
class MeshProgress:
    """What the child said last: the meshes tried so far, and whether it is done."""

    rows: tuple[MeshRow, ...]
    done: bool = False
    seconds: float = 0.0  # the search's seconds so far
    error: str | None = None
    best_at: float | None = None  # seconds into the search when the best so far was found
    how: str = ""  # how it ended (``MeshSearch.how``)


class MeshSearchJob:
    """``session.search_meshes(request)`` in a forked child; ``receive`` (from the page's
    clock) reads its rounds. The page's thread is the only one that talks to it."""

    def __init__(self, session: Session, request: MeshRequest, *, name: str = "", lock: threading.Lock | None = None):
        self.name = name
        self.request = request
        self.progress = MeshProgress(())
        self._closed = False
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, name=f"partex-meshes-{name}", daemon=True,
                                 args=(child, self._conn, session, request))
        if lock is not None:
            with lock:  # the session is not changed by another thread while it is copied
                start_forked(self._proc)
        else:
            start_forked(self._proc)
        child.close()

    def receive(self) -> MeshProgress:
        """What the child sent since (never blocks). A child gone without a word is an error."""
        while not self._closed:
            try:
                if not self._conn.poll(0):
                    break
                msg = self._conn.recv()
            except (EOFError, OSError):
                if not self.progress.done:
                    self.progress = dataclasses.replace(self.progress, done=True,
                                                        error="the mesh search's process ended unexpectedly")
                self._finish()
                break
            kind = msg[0]
            if kind == "round":
                self.progress = MeshProgress(tuple(msg[1]), seconds=msg[2], best_at=msg[3])
            elif kind == "done":
                self.progress = MeshProgress(tuple(msg[1]), done=True, seconds=msg[2], best_at=msg[3], how=msg[4])
                self._finish()
            elif kind == "error":
                if msg[2]:  # not bad input: the child's own failure, logged whole
                    log.error("partex: the mesh search failed (session %s):\n%s", self.name, msg[2])
                self.progress = dataclasses.replace(self.progress, done=True, error=msg[1])
                self._finish()
        return self.progress

    def _finish(self) -> None:
        self._closed = True
        threading.Thread(target=self._reap, args=(2.0,), name=f"partex-reap-meshes-{self.name}", daemon=True).start()

    def close(self) -> None:
        """Stop the child now (a newer search, another model, the tab closed)."""
        if self._closed:
            return
        self._finish()
        self._proc.terminate()

    def _reap(self, wait: float) -> None:
        reap(self._proc, self._conn, wait)


def _child_main(conn, parent_end, session: Session, request: MeshRequest) -> None:
    parent_end.close()  # its copy of the server's end would hide the server's exit
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.nice(CHILD_NICENESS)
    gc.freeze()
    try:
        searcher = session.mesh_searcher(request.devices, topology=request.topology, max_axes=request.max_axes,
                                         pipelines=request.pipelines, effort=effort_of(request.seconds))
        found = searcher.run(request.seconds, callback=lambda trials: conn.send(
            ("round", ranked_rows(trials), searcher.seconds_now(), searcher.best_at)))
        conn.send(("done", [MeshRow.of(t) for t in found.trials], found.seconds, found.best_at, found.how()))
    except PartexError as e:
        conn.send(("error", str(e), None))
    except (EOFError, OSError, KeyboardInterrupt):  # the server went away
        return
    except Exception as e:  # the process's boundary: one line on the page, the traceback logged
        conn.send(("error", f"internal error: {type(e).__name__}: {e}", traceback.format_exc()))


def ranked_rows(trials) -> list[MeshRow]:
    """The trials as rows, best first as ``MeshSearch`` ranks them (those not searched last)."""
    def key(t: MeshTrial):
        return (t.note != "", t.step_time if t.step_time is not None else float("inf"),
                t.warm_step if t.warm_step is not None else float("inf"))
    return [MeshRow.of(t) for t in sorted(trials, key=key)]


def rows_table(rows, current: str | None, running: bool) -> list[tuple]:
    """The card's table rows: best first as the search sorts them; ``current``: the mesh
    the page is on (name=size pairs), marked; ``running``: whether the halving goes on."""
    best = next((r.name for r in rows if r.step is not None), None)
    out = []
    for r in rows:
        tags = [t for t, on in (("chosen", r.name == best), ("on the page", r.name == current)) if on]
        mesh = f"<b>{esc(r.label)}</b>" + "".join(f" <span class='chip'>{t}</span>" for t in tags)
        if r.pipeline:
            mesh += (f"<div class='small'>pipeline {esc(r.pipeline)}"
                     + (f", bubble {r.bubble:.0%}" if r.bubble is not None else "") + "</div>")
        if r.mesh != r.label:
            mesh += f"<div class='small muted'>{esc(r.mesh)} (GB/s per axis)</div>"
        if r.note:
            out.append((mesh, "-", "-", "-", "-", "-", f"<span class='muted'>not searched: {esc(r.note)}</span>"))
            continue
        state: str = STATES.get(r.status) or r.status
        if r.status in ("open", "not reached", "left out"):  # not built: nothing known of its plans yet
            out.append((mesh, "-", "-", "-", "-", "-", f"<span class='muted'>{esc(state)}</span>"))
            continue
        if r.status == "dropped":
            state += f" after round {r.rounds}"
        elif r.open and not running:  # the child is gone (stopped from the page)
            state = "stopped"
        step = fmt_time(r.step) if r.step is not None else "<span class='bad'>none fits</span>"
        out.append((mesh, fmt_time(r.hand) if r.hand is not None else "none fits", step, fmt_pct(r.mfu),
                    fmt_bytes(r.memory) if r.memory is not None else "-", f"{r.simulations:,}",
                    f"<span class='muted'>{state}</span>"))
    return out


class MeshesView(pn.viewable.Viewer):
    """The Meshes card: the form (devices, topology, axes, pipelines, seconds), the meshes tried, and
    the pick of one to continue on."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.devices = keyed(pn.widgets.IntInput)("partex-mesh-devices", label="Devices", start=1, value=8, width=110)
        self.topology = text_input("partex-mesh-topology", "Topology", placeholder="one slice; or 4x64@6.25",
                                   width=190, description="SLICESxDEVICES[@GB/s]: slices (or hosts) joined by a "
                                   "slower network, its bandwidth per device; one axis (data) crosses it")
        self.axes = select("partex-mesh-axes", "Axes at most", options=list(AXES), value="4", width=100)
        self.seconds = keyed(pn.widgets.IntInput)("partex-mesh-seconds", label="Seconds", start=1,
                                                   value=DEFAULT_SECONDS, width=100)
        self.go = button("partex-mesh-search", "Search meshes", color="primary", margin=(27, 10, 5, 10),
                         description=tip_left("Every factorisation of the devices into named axes, each searched "
                                              "with the plan by successive halving, in its own process"))
        self.pipelines = select("partex-mesh-pipelines", "Pipelines", options=list(PIPELINES),
                                value=DEFAULT_PIPELINES, width=150,
                                description="Candidates that run a scanned layer stack as a pipeline: a stage per "
                                            "slice, also stages within a slice, or none")
        on_click(self.go, s.clock, "the Search meshes button",
                 lambda: s.search_meshes(self.devices.value, self.topology.value, self.seconds.value,
                                         self.axes.value, self.pipelines.value))
        self.stop = button("partex-mesh-stop", "Stop", margin=(27, 10, 5, 0))
        on_click(self.stop, s.clock, "the meshes' Stop button", s.stop_meshes)
        self.status = html(name="partex-mesh-status", sizing_mode="stretch_width")
        self.table = Table("partex-meshes", [("mesh", "mesh"), ("hand", "best hand plan"), ("step", "searched"),
                                             ("mfu", "MFU"), ("memory", "peak memory"), ("sims", "simulations"),
                                             ("state", "")],
                           height=320, html_fields=("mesh", "step", "state"),
                           empty="press Search meshes: the meshes tried appear here, best first")
        self.pick = select("partex-mesh-pick", "Continue on", options=[], width=320, disabled=True)
        self.use = button("partex-mesh-use", "Use this mesh", color="success", margin=(27, 10, 5, 10),
                          disabled=True, description="The page's search restarts on that mesh from the plan found "
                                                     "there, pins kept")
        on_click(self.use, s.clock, "the Use this mesh button", lambda: s.use_mesh(self.pick.value))
        from ._controls import FieldErrors  # the sidebar's marks, on this card's fields

        self.errors = FieldErrors(s, "meshes", {"devices": self.devices, "topology": self.topology,
                                                "pipelines": self.pipelines, "seconds": self.seconds})
        self._rows_seen = None  # the rows the pick was last set from: new ones reset it to the best
        on_change(s, s.clock, "the Meshes card", self._render, ["mesh_rows", "mesh_status", "config", "busy"])
        on_change(s, s.clock, "the Meshes card's devices", self._devices, ["config"])
        self._devices()
        self._render()
        self._panel = pn.Column(
            pn.Row(self.devices, self.topology, self.axes, self.pipelines, self.seconds, self.go, self.stop,
                   sizing_mode="stretch_width"),
            self.errors.note, self.status, self.table.pane,
            pn.Row(self.pick, self.use, sizing_mode="stretch_width"),
            sizing_mode="stretch_width")

    def __panel__(self):
        return self._panel

    def _devices(self, *_):
        """The form's device count follows the page's mesh until a search has run."""
        c = self.state.config
        if c is not None and not self.state.mesh_rows:
            self.devices.value = c.mesh.size

    @bokeh_update
    def _render(self, *_):
        s = self.state
        running = "meshes" in s.busy
        self.go.disabled = running
        self.stop.disabled = not running
        c = s.config
        current = c.mesh.text() + (f" | {c.pipeline.text()}" if c.pipeline else "") if c is not None else None
        rows = s.mesh_rows
        self.table.update(rows_table(rows, current, running))
        options = {f"{r.name} · {fmt_time(r.step)}": r.key for r in rows if r.step is not None}
        self.pick.options = options
        if options and (self._rows_seen is not rows or self.pick.value not in options.values()):
            self.pick.value = next(iter(options.values()))  # new rows: the best first
        self._rows_seen = rows
        self.pick.disabled = self.use.disabled = not options
        self.status.object = f"<div class='muted'>{s.mesh_status}</div>" if s.mesh_status else ""

