"""The plan card's actions (``PlanCard``): the plan shown and its file, an uploaded plan, XLA's
verification of a plan and a measurement of the plans on this machine's devices."""

from __future__ import annotations

import re
from typing import Any, Callable

from partex import PartexError, VerifyReport

from ._banner import Banner
from ._engine import PlanSummary, Workspace, plan_rows, upload_refusal
from ._format import fmt_bytes, fmt_time
from ._loop import Submit
from ._slice import ParamSlice


class PlanCard:
    """Acts on the plans the page lists (the search's best, an upload, the baselines). Owns the
    upload (``uploaded``), the plan shown (``shown_plan``), the verification (``verify_status``,
    ``verify_result``, ``verified_plan``) and the measurement (``measure_status``,
    ``measured``): ``page`` sets these and reads ``best``, ``baselines``, ``workspace``,
    ``config`` and ``busy``. The slow work runs through ``submit(kind, work, done)``;
    ``runner()`` is the page's search (a plan XLA puts over the budget is marked infeasible
    there); ``probe()`` updates the state's JSON after a result; ``upload_limit``: the
    largest plan file it reads, in bytes (a larger one is refused, said in the banner)."""

    def __init__(self, page: ParamSlice, banner: Banner, submit: Submit, runner: Callable[[], Any],
                 probe: Callable[[], None], upload_limit: int):
        self.page = page
        self.banner = banner
        self.submit = submit
        self.runner = runner
        self.probe = probe
        self.upload_limit = upload_limit

    def summary(self, name: str | None = None) -> PlanSummary | None:
        """The plan ``name`` ("search", "uploaded" or a baseline's; None: the one shown)."""
        name = name or self.page.shown_plan
        if name == "search":
            return self.page.best
        if name == "uploaded":
            return self.page.uploaded
        return self.page.baselines.get(name)

    def filename(self) -> str:
        """The file name the Download button offers: the model, preset and mesh in it."""
        ws = self.page.workspace
        if ws is None:
            return "partex-plan.json"
        mesh = ws.config.mesh.text().replace("=", "").replace(",", "-")
        return f"partex-plan-{_slug(ws.choice.spec)}-{ws.choice.preset}-{mesh}.json"

    def json(self) -> str | None:
        """The best plan's JSON (the Download button)."""
        best = self.page.best
        if best is None:
            self.banner.notify("no plan to download yet: run the search until it finds one that fits", "warning")
            return None
        return best.plan.dumps()

    def keep_for(self, ws: Workspace) -> None:
        """The page shows ``ws`` now: an upload stays where it is of the same model; the
        verification and the measurement were of the plans before, and go."""
        uploaded = self.page.uploaded
        self.page.set(uploaded=None if uploaded is None or not ws.same_model(uploaded) else uploaded,
                      verify_result=None, verify_status="", measured={}, measure_status="")

    def keep_shown(self, baselines: dict) -> None:
        """The plan shown stays where the page still lists it; else the search's is shown."""
        if self.page.shown_plan not in ("search", "uploaded", *baselines):
            self.page.shown_plan = "search"

    # ------------------------------------------------------------------ upload
    def upload(self, data: bytes, filename: str) -> None:
        """Read a plan file the user gave (in a worker thread) and list it as "uploaded"; one
        over the upload limit is refused unread (the page keeps what it shows)."""
        filename = filename or "uploaded plan"
        refused = upload_refusal(len(data), self.upload_limit, filename)
        if refused is not None:
            self.banner.notify(refused, "danger")
            return
        ws = self.page.workspace
        if ws is None:
            self.banner.notify("load a model before uploading a plan", "warning")
            return

        def work():
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise PartexError(f"{filename} is not a text file: a plan is JSON written by partex") from None
            try:
                return ws.uploaded(text, filename)
            except PartexError as e:
                raise PartexError(f"could not read the uploaded plan: {e}") from None

        self.submit("upload", work, self._uploaded)

    def _uploaded(self, summary: PlanSummary) -> None:
        r = summary.report
        # the message first: a page that sees the uploaded plan also sees what it is
        self.banner.notify(f"uploaded plan: {len(summary.decisions)} decisions on {summary.plan.mesh.text()}, "
                           f"predicted step {fmt_time(r.step_time)}, peak {fmt_bytes(r.memory.peak)} per device",
                           "success")
        self.page.uploaded = summary
        self.page.shown_plan = "uploaded"
        self.probe()

    # ------------------------------------------------------------------ verify
    def verify(self) -> None:
        """Compile the shown plan with XLA on simulated devices (a subprocess) and compare."""
        summary = self.summary() or self.page.best
        if summary is None:
            self.banner.notify("nothing to verify yet: run the search or pick a baseline in the plan view", "warning")
            return
        if "verify" in self.page.busy:
            self.banner.notify("a verification is already running", "info")
            return
        ws = self.page.workspace
        self.page.verify_status = (f"running: compiling the {summary.name} plan on {summary.plan.mesh.size} "
                                   "simulated devices")
        self.page.set(verify_result=None, verified_plan=summary.name)  # the plan whose result is awaited

        def work():
            # the page's copy of the session compiles; the search's own copy (in the runner)
            # learns the verdict in _verified, as Session.verify(mark=True) would
            out = ws.session.verify(summary.plan, mark=False, timeout=600, explain=True)
            return summary.name, out

        self.submit("verify", work, self._verified)

    def _verified(self, result: tuple[str, VerifyReport]) -> None:
        name, out = result
        self.page.verified_plan, self.page.verify_result = name, out
        self.page.verify_status = f"done: the {name} plan compiled in {out.compile_seconds} s"
        if not out.fits:
            device = out.xla_memory.get("device", out.memory.xla)
            text = (f"XLA puts the {name} plan at {fmt_bytes(device)} of device memory, over the "
                    f"budget of {fmt_bytes(out.budget)} (predicted {fmt_bytes(out.memory.predicted)})")
            summary = self.summary(name)
            r = self.runner()
            if name == "search" and summary is not None and r is not None and r.alive:
                try:
                    r.call("mark_infeasible", list(summary.decisions), device)
                    text += ": marked infeasible, the search's best moves to the next plan that fits"
                except PartexError as e:
                    text += f"; could not mark it infeasible: {e}"
            self.banner.notify(text, "warning")
        self.probe()

    def verify_failed(self) -> None:
        self.page.verify_status = "failed"

    # ------------------------------------------------------------------ measure
    def measure(self, steps: int = 3) -> None:
        """Run the listed plans that fit (the search's, an upload, the baselines) on this
        machine's devices for a few steps, each in its own process (``Session.measure``),
        and put their measured step time and peak beside the prediction."""
        if "measure" in self.page.busy:
            self.banner.notify("a measurement is already running", "info")
            return
        rows = [(name, r) for name, r in plan_rows(self.page) if r.report.fits]
        if not rows:
            self.banner.notify("nothing to measure yet: no plan listed fits the budget", "warning")
            return
        ws = self.page.workspace
        n = rows[0][1].plan.mesh.size
        self.page.measure_status = (f"running: {len(rows)} plan{'s' if len(rows) > 1 else ''} on {n} devices, "
                                    f"{steps} steps each, one process per plan")

        def work():
            plans = [r.plan for _, r in rows]
            out = ws.session.measure(plans, steps=steps, labels=[name for name, _ in rows], timeout=900)
            return {name: (r.plan.digest(), m) for (name, r), m in zip(rows, out)}

        self.submit("measure", work, self._measured)

    def _measured(self, result: dict) -> None:
        self.page.measured = {**self.page.measured, **result}
        done = [m for _, m in result.values()]
        where = f"{done[0].devices} x {done[0].device}" if done else "this machine"
        failed = [m.label for m in done if m.error is not None]
        hw = self.page.config.hw if self.page.config is not None else None
        other = hw is not None and done and (hw.profile is None or hw.profile.device != done[0].device)
        self.page.measure_status = (f"done: measured on {where}" + (" (simulated on the CPU: the host's times)"
                                                                    if done and done[0].platform == "cpu" else "")
                                    + (f"; did not run: {', '.join(failed)}" if failed else "")
                                    + (f"; the predictions are priced for {hw.name}, not for these devices"
                                       if other and hw is not None else ""))
        ran = sorted((m for m in done if m.step_time is not None), key=lambda m: m.step_time or 0.0)
        if len(ran) > 1:
            by_pred = min(ran, key=lambda m: m.predicted_step_time or 0.0)
            if by_pred.label != ran[0].label:
                self.banner.notify(f"measured fastest: {ran[0].label} ({fmt_time(ran[0].step_time)}); the "
                                   f"prediction ranked {by_pred.label} first ({fmt_time(by_pred.step_time)} "
                                   "measured)", "warning")
        self.probe()

    def measure_failed(self) -> None:
        self.page.measure_status = "failed"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"
