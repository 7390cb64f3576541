"""The Meshes card's search on the page's side (``MeshCard``): the job in a forked child
(``_meshes.MeshSearchJob``), its progress and outcome in words."""

from __future__ import annotations

from typing import Callable

from partex import PartexError, candidate_meshes

from ._banner import MESH_SEARCH_FIELDS, Banner
from ._engine import Workspace
from ._format import fmt_bytes, fmt_time
from ._meshes import MeshProgress, MeshRequest, MeshSearchJob
from ._pool import SearchTurn, queue_words
from ._slice import ParamSlice


class MeshCard:
    """Owns the mesh search in flight or last run (``job``) and the model, hardware and budget
    its rows were found for. ``page``: the state's ``mesh_rows`` and ``mesh_status`` (set),
    ``busy`` and ``config`` (read); ``mark(kind, on)`` puts ``meshes`` in ``busy`` while the search runs.
    ``name``: the session's id (the child's name ends with it). The search starts when it has
    one of the server's search slots (``turn``: the page's, ``SearchTurn.sync_meshes``): at
    once where one is free or the page's own search holds one, else when its turn comes,
    its place in the queue shown meanwhile; it keeps the slot to its end."""

    def __init__(self, page: ParamSlice, banner: Banner, mark: Callable[[str, bool], None], name: str,
                 turn: SearchTurn):
        self.page = page
        self.banner = banner
        self.mark = mark
        self.name = name
        self.turn = turn
        self.job: MeshSearchJob | None = None
        self._pending: tuple | None = None  # (session, request, lock, candidates) waiting for a slot
        self._for: tuple | None = None  # (analysis, hardware) the rows were found for

    @property
    def running(self) -> bool:
        return "meshes" in self.page.busy

    def search(self, ws: Workspace | None, devices, topology: str, seconds, max_axes, pipelines: str) -> None:
        """Search every factorisation of ``devices`` (laid out as ``topology``) on the page's
        model ``ws``, with its hardware and budget: ``Session.search_meshes`` in a forked
        child, with the pipelined candidates ``pipelines`` names (``_meshes.PIPELINES``); its
        rounds show as they come (``poll``)."""
        if ws is None:
            self.banner.notify("no model yet: wait for it to load (or press Analyze)", "warning")
            return
        try:
            request = MeshRequest.parse(devices, topology, seconds, max_axes, pipelines)
            meshes = candidate_meshes(request.devices, request.topology, request.max_axes)
        except PartexError as e:
            self.banner.bad_input(PartexError(str(e).replace("--", ""), field=e.field or "devices"))
            return
        self.banner.clear(*MESH_SEARCH_FIELDS)
        if self.job is not None:
            self.job.close()
            self.job = None
        self._pending = (ws.session, request, ws.lock, len(meshes))
        self._for = (ws.base, ws.config.hw)
        self.page.set(mesh_rows=[], mesh_status="")
        self.mark("meshes", True)
        self._start_in_turn()

    def _start_in_turn(self) -> None:
        """Start the pending search if it has a slot now; else say its place in the queue."""
        assert self._pending is not None
        standing = self.turn.sync_meshes(True)
        if standing.state != "running":
            words = (f"{queue_words(standing)}: the mesh search starts when its turn comes (Stop leaves the "
                     "queue)")
            if words != self.page.mesh_status:
                self.page.mesh_status = words
            return
        session, request, lock, n = self._pending
        self._pending = None
        self.job = MeshSearchJob(session, request, name=self.name, lock=lock)
        self.page.mesh_status = (
            f"searching the {n} meshes of {request.text()} (and their pipelines, where asked) for at most "
            f"{request.seconds:g} s: narrowest first, each from its hand plans and the best plan so far, "
            "rounds of successive halving")

    def _release(self) -> None:
        """The search ended, stopped or was dropped: its slot, or its place, goes to the next."""
        self._pending = None
        self.turn.sync_meshes(False)

    def stop(self) -> None:
        """Stop the mesh search: the meshes tried so far stay in the card."""
        if self.running and self._pending is not None:
            self._release()
            self.page.mesh_status = "stopped before it started: it was waiting for a search slot"
            self.mark("meshes", False)
        elif self.job is not None and self.running:
            self.job.close()
            self._release()
            rows = self.page.mesh_rows
            best = next((r for r in rows if r.step is not None), None)
            self.page.mesh_status = (f"stopped: best so far {best.name} at {fmt_time(best.step)} per step, "
                                     f"of {len(rows)} candidates" if best is not None else
                                     f"stopped: no plan that fits yet, of {len(rows)} candidates")
            self.mark("meshes", False)

    def keep_for(self, ws: Workspace) -> None:
        """The page shows ``ws`` now: rows tried on another model, hardware or budget go."""
        if self._for is None or self._for == (ws.base, ws.config.hw):
            return
        if self.job is not None:
            self.job.close()
        self._release()
        self._for = None
        with self.page.batch():
            self.page.set(mesh_rows=[], mesh_status="")
            self.mark("meshes", False)

    def poll(self) -> None:
        """Show the search's latest rounds; its outcome in words once it is done."""
        if not self.running:
            if self.turn.meshes.state != "idle":  # a slot or a place no search of the card wants
                self._release()
            return
        if self._pending is not None:
            self._start_in_turn()
            return
        job = self.job
        if job is None:
            return
        p = job.receive()
        if list(p.rows) != self.page.mesh_rows:
            self.page.mesh_rows = list(p.rows)
        if not p.done:
            if p.rows:
                self.page.mesh_status = progress_text(p)
            return
        self.mark("meshes", False)
        self._release()
        if p.error:
            self._end(f"the mesh search failed: {p.error}", "danger")
            return
        best = next((r for r in p.rows if r.step is not None), None)
        n = len(p.rows)
        head = f"{n} mesh{'es' if n != 1 else ''} of {job.request.text()} in {p.seconds:.1f} s"
        if p.rows and all(r.note for r in p.rows):
            self._end(f"{head}: the model can use none of them ({p.rows[0].note})", "warning")
        elif best is None:
            self._end(f"{head}: no plan fits the budget of {fmt_bytes(self.page.config.hw.budget)} per device "
                      "on any: raise the budget or give more devices", "warning")
        else:
            status = (f"{head} ({p.how}): the best is {best.name} at {fmt_time(best.step)} per step; pick a mesh "
                      "and press Use this mesh to continue on it")
            self.page.mesh_status = status
            self.banner.notify(f"mesh search done: {status}", "success")

    def _end(self, status: str, level: str) -> None:
        self.page.mesh_status = status
        self.banner.notify(status, level)

    def close(self) -> None:
        if self.job is not None:
            self.job.close()
        self._release()



def progress_text(p: MeshProgress) -> str:
    """A running search in words: the incumbent (the best so far, and when it was found) and
    the candidates still open."""
    best = next((r for r in p.rows if r.step is not None), None)
    still = sum(r.open for r in p.rows)
    where = f"{p.seconds:.0f} s in: " if p.seconds else ""
    head = (f"{where}best so far {best.name} at {fmt_time(best.step)} per step"
            + (f" (found after {p.best_at:.1f} s)" if p.best_at is not None else "")
            if best is not None else f"{where}no plan that fits yet")
    searching = [r.name for r in p.rows if r.status == "searching"]
    return (f"{head}; {still} of {len(p.rows)} candidates open"
            + (f", searching {searching[0]}" if searching else ""))
