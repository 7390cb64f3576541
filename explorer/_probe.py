"""The state as JSON data, for tests and scripts (``partex-state``): ``probe_of`` and the
watcher that keeps the state's ``probe`` up to date (``Probe``)."""

from __future__ import annotations

import json
import os

import param

from ._loop import PageClock

# The parameters whose change the probe shows at once. Others (a verification's report, a
# measurement) change beside one of these, or are followed by ``Probe.update``.
PROBED = ("ping", "message", "message_level", "field_error", "phase", "busy", "running", "search_queue", "best", "pins",
          "forbidden", "uploaded", "verify_status", "measure_status", "sessions", "selected_group", "workspace",
          "baselines", "stats", "mesh_rows", "mesh_status", "link", "opened_session")


def probe_of(state) -> dict:
    """The state (an ``ExplorerState``) as JSON data."""
    best, ws = state.best, state.workspace
    an = ws.an if ws else None
    label = an.decision_label if an else str
    return {
        "phase": state.phase,
        "busy": list(state.busy),
        "model": ws.choice.to_json() if ws else None,
        "config": ws.config.to_json() if ws else None,
        "running": state.running,
        "queue": {"words": state.search_queue, **state.driver.turn.standing.to_json()},
        "simulations": state.stats.simulations,
        "best": None if best is None else {
            "step_time": best.report.step_time, "peak": best.report.memory.peak, "fits": best.report.fits,
            "decisions": [d.to_json() for d in best.plan.decisions], "simulation": best.simulation},
        "history": len(state.stats.best_history),
        "pins": [label(d) for d in state.pins],
        "forbidden": [label(d) for d in state.forbidden],
        "held": [label(d) for d in (*state.held.pins, *state.held.forbidden)],
        "baselines": {k: v.report.step_time for k, v in state.baselines.items()},
        "uploaded": None if state.uploaded is None else state.uploaded.plan.mesh.text(),
        "verify": state.verify_status,
        "measure": state.measure_status,
        "measured": {k: m.to_json() for k, (_, m) in state.measured.items()},
        "message": state.message,
        "level": state.message_level,
        "field_error": state.field_error,
        "selected": an.groups[state.selected_group].label if an and state.selected_group is not None else None,
        "sessions": list(state.sessions),
        "opened_session": state.opened_session,
        "link": state.link,
        "meshes": {"status": state.mesh_status, "rows": [
            {"mesh": r.label, "form": r.mesh, "pipeline": r.pipeline or None, "bubble": r.bubble, "hand": r.hand,
             "step": r.step, "note": r.note, "status": r.status}
            for r in state.mesh_rows]},
        "timings": {**{k: round(v, 1) if isinstance(v, float) else v for k, v in state.clock.report().items()},
                    "slowest": [[what, round(ms, 1), round(cpu, 1)] for what, ms, cpu in state.clock.slowest]},
        "ping": state.ping,
        "server_pid": os.getpid(),
        "search_pid": state.runner.pid if state.runner is not None else None,
        "session": state.session_id,
    }


class Probe:
    """Keeps ``state.probe`` (the only parameter it sets) the JSON of ``probe_of(state)``: on a
    change of any parameter in PROBED, and on ``update``. ``state``: an ``ExplorerState``,
    read whole (the probe shows all of it); ``clock``: its page's clock, which times the
    watcher."""

    def __init__(self, state: param.Parameterized, clock: PageClock):
        self.state, self.clock = state, clock
        state.param.watch(clock.watcher("the state's probe JSON", self._changed), list(PROBED))

    def _changed(self, *events) -> None:
        self.update()

    def update(self) -> None:
        """Write the probe: once, when the page's callback running now ends (its changes all
        made; at once where none runs)."""
        self.clock.later(self, self._write)

    def _write(self) -> None:
        self.state.param.update(probe=json.dumps(probe_of(self.state)))
