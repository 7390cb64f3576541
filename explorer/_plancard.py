"""The plan card's actions (``PlanCard``): the plan shown and its file, an uploaded plan, XLA's
verification of a plan and a measurement of the plans on this machine's devices."""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from partex import PartexError, VerifyReport

from ._banner import Banner
from ._engine import PlanSummary, Workspace, plan_rows, upload_refusal
from ._format import fmt_bytes, fmt_time
from ._loop import Submit
from ._pool import host_memory
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
        # the model the upload was scored on (its decisions are that analysis's group ids) and
        # its file's name
        self._scored_on: Workspace | None = None
        self._upload_name = ""
        self._again: tuple[Workspace, str] | None = None  # an upload to score on a new step (``keep_for``)

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
        """The page shows ``ws`` now: an upload stays where it is of the same model (its
        inputs), scored again (``score_again``) where ``ws`` is another step (another
        pipeline, say: its decisions name another analysis's groups) or prices on other
        hardware or budget; the verification and the measurement were of the plans before, and
        go."""
        uploaded, scored_on = self.page.uploaded, self._scored_on
        carried = uploaded is not None and ws.same_model(uploaded)
        again = carried and scored_on is not None and (scored_on.an is not ws.an
                                                       or scored_on.session.hardware != ws.session.hardware)
        self.page.set(uploaded=uploaded if carried and not again else None,
                      verify_result=None, verify_status="", measured={}, measure_status="")
        self._again = (ws, uploaded.plan.dumps()) if again and uploaded is not None else None

    def score_again(self) -> None:
        """Score the upload ``keep_for`` set aside on the page's new step (in a worker thread:
        asked after the new search's child is forked, which waits for the workspace's lock)."""
        if self._again is not None:
            (ws, text), self._again = self._again, None
            self._score(ws, text, self._upload_name, self._carried,
                        "the uploaded plan is no longer listed: it does not apply to the new step")

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

        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.banner.notify(f"{filename} is not a text file: a plan is JSON written by partex", "danger")
            return
        self._score(ws, text, filename, self._uploaded, "could not read the uploaded plan")

    def _score(self, ws: Workspace, text: str, filename: str, done: Callable[[PlanSummary], None],
               failed: str) -> None:
        """Score the plan file ``text`` on ``ws``'s step in a worker thread; ``done`` gets its
        summary where the page still shows that step (else it is scored again on the page's);
        a plan that does not score is said after ``failed``."""

        def work():
            try:
                return ws.uploaded(text, filename)
            except PartexError as e:
                raise PartexError(f"{failed}: {e}") from None

        def scored(summary: PlanSummary) -> None:
            now = self.page.workspace
            if now is not None and (now.an is not ws.an  # the step or the prices changed meanwhile
                                    or now.session.hardware != ws.session.hardware):
                if now.same_model(summary):
                    self._score(now, text, filename, done, failed)
                return
            self._scored_on, self._upload_name = ws, filename
            done(summary)

        self.submit("upload", work, scored)

    def _carried(self, summary: PlanSummary) -> None:
        """The upload, scored again on the page's new step, listed as it was."""
        self.page.uploaded = summary
        self.probe()

    def _uploaded(self, summary: PlanSummary) -> None:
        r = summary.report
        # the message first: a page that sees the uploaded plan also sees what it is
        page_hw, file_hw = self.page.workspace.session.hardware.name, summary.plan.hardware.name
        priced = f" on {page_hw} (its file says {file_hw})" if file_hw != page_hw else ""
        self.banner.notify(f"uploaded plan: {len(summary.decisions)} decisions on {summary.plan.mesh.text()}, "
                           f"predicted step {fmt_time(r.step_time)}{priced}, peak {fmt_bytes(r.memory.peak)} per device",
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
                def marked(ok: bool, value) -> None:
                    self.banner.notify(text + (": marked infeasible, the search's best moves to the next plan that fits"
                                               if ok else f"; could not mark it infeasible: {value}"), "warning")

                r.ask("mark_infeasible", list(summary.decisions), device, done=marked)
            else:
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
        host = host_memory() if measures_on_cpu() else None
        if host is not None:  # simulated devices share this machine's memory: a plan over it is never run
            least = min((r for _, r in rows), key=lambda r: r.report.memory.peak * r.plan.mesh.size)
            need = least.report.memory.peak * least.plan.mesh.size
            rows = [(name, r) for name, r in rows if r.report.memory.peak * r.plan.mesh.size <= host]
            if not rows:
                self.page.measure_status = f"not run: the smallest plan needs {fmt_bytes(need)} of this machine's memory"
                self.banner.notify(f"cannot measure here: the plans run on simulated CPU devices, which share this "
                                   f"machine's {fmt_bytes(host)} of memory, and the smallest needs {fmt_bytes(need)} "
                                   f"({fmt_bytes(least.report.memory.peak)} on each of its {least.plan.mesh.size} "
                                   "devices); measure a smaller preset here, or run `partex measure` on the devices "
                                   "the plan is for", "warning")
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


def measures_on_cpu() -> bool:
    """Whether a measurement runs on simulated CPU devices (``partex.plan.measure``: the
    platforms the server's devices are on, else the ones JAX finds)."""
    platforms = os.environ.get("PARTEX_DEVICE_PLATFORMS", os.environ.get("JAX_PLATFORMS", ""))
    if platforms:
        return platforms.split(",")[0] == "cpu"
    import jax

    return jax.default_backend() == "cpu"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"
