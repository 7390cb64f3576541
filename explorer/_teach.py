"""Teach: a guided walkthrough of the loaded model that a teacher clicks through in front
of a class. Each step explains one idea (named dimensions, a conflict, how a decision
becomes collectives, memory, the search, verification, comparison), points at the card
that shows it, and sets what that card should show (a group in the Decision card, a plan
in the Plan card).

Every sentence is computed from the loaded model: its analysis, its groups' roles (from
structure, ``partex``'s ``Analysis.roles``), the baselines' cost reports. A step whose
subject the model lacks (a conflict, a tensor-parallel pair, a baseline) is left out.
``walkthrough`` makes the steps and knows nothing of Panel; ``TeachView`` shows them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import panel as pn
import param

from partex import RESOLUTIONS, CostReport, Decision, Resolve, Shard

from ._engine import PlanSummary, Workspace, short_source
from ._format import esc, fmt_bytes, fmt_time
from ._widgets import CSS, button, html, on_change, on_click

# the titles of the page's cards a step can point at
CARDS = ("Named dimensions", "Decision", "Search", "Memory per device", "Baselines", "Plan",
         "Predicted vs XLA", "Compare")
TENSORS_SHOWN = 3  # a group's input tensors named in its step (the Decision card lists them all)
BASELINES_SHOWN = 3  # the baselines over the budget named in the search's step


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the walkthrough."""

    title: str
    body: str  # HTML; the model's own text (labels, paths, source lines) escaped
    target: str  # the title of the card that shows it: one of CARDS
    action: dict[str, Any] = dataclasses.field(default_factory=dict)  # ExplorerState params set when shown
    compare: tuple[str, str] | None = None  # the plans A and B the Compare card shows with it


@dataclasses.dataclass(frozen=True)
class _Model:
    """What the steps read: the loaded workspace, its group infos and baselines."""

    ws: Workspace
    infos: dict
    baselines: dict[str, PlanSummary]

    @property
    def an(self):
        return self.ws.an

    def label(self, g: int) -> str:
        return self.an.groups[g].label

    def decision(self, d: Decision) -> str:
        return esc(self.an.decision_label(d, arrow=" → "))

    def axis_of(self, plan: str, g: int) -> str | None:
        """The mesh axis baseline ``plan`` gives group ``g`` (None: it leaves it alone)."""
        summary = self.baselines.get(plan)
        if summary is None:
            return None
        return next((d.axis for d in summary.decisions if isinstance(d, Shard) and d.group == g), None)


def walkthrough(state) -> list[Step]:
    """The steps for the model ``state`` holds; [] while none is loaded."""
    if state.workspace is None or not state.infos:
        return []
    m = _Model(state.workspace, dict(state.infos), dict(state.baselines))
    return [s for s in (make(m) for make in STEPS) if s is not None]


def _b(text) -> str:
    return f"<b>{esc(text)}</b>"


def _tensors(info, n: int = TENSORS_SHOWN) -> str:
    named = ", ".join(f"<code>{esc(p)}</code> dim {d}" for p, _, d in info.tensors[:n])
    more = f" and {len(info.tensors) - n} more" if len(info.tensors) > n else ""
    return named + more


def _collective(c) -> str:
    times = f" ×{c.count}" if c.count > 1 else ""
    return (f"<b>{esc(c.kind)}</b> over {esc(', '.join(c.axes))} of {fmt_bytes(c.bytes)}{times} at "
            f"<code>{esc(short_source(c.source) if c.source else f'op {c.op}')}</code>")


def _caused(report: CostReport, label: str, axis: str, ops: frozenset, inside: bool):
    """The largest collective (bytes per step) that group ``label`` on ``axis`` causes at an
    op inside ``ops`` (or outside, with ``inside`` False); None if there is none."""
    found = [c for c in report.collectives
             if c.cause == label and axis in c.axes and (c.op in ops) == inside]
    return max(found, key=lambda c: c.bytes * c.count, default=None)


# --------------------------------------------------------------------------- the steps

def _traced(m: _Model) -> Step:
    an = m.an
    s = an.summary()
    mesh = m.ws.config.mesh
    space = an.decision_space(len(mesh.axes))
    conflicts = (f" {s['conflicts']} {'conflict needs' if s['conflicts'] == 1 else 'conflicts need'} a decision "
                 "of its own (a red ring)." if s["conflicts"] else "")
    body = (f"partex traced {esc(m.ws.choice.title)}: <b>{s['ops']:,} ops</b> over {s['dims']:,} tensor dims. "
            f"Dims that must be sharded alike form <b>{s['named_dims']} named dimensions</b>; grouped by role (one "
            f"dim repeated in every layer is one group), they make <b>{s['groups']} decision groups</b>, the nodes "
            "of the graph. "
            f"On the {esc(mesh.text())} mesh that is {space['groups']} groups × {len(mesh.axes)} axes = "
            f"<b>{space['decisions']} decisions</b>, instead of {space['raw_decisions']:,} per tensor dim."
            + conflicts)
    return Step("What partex traced", body, "Named dimensions")


def _named_dims(m: _Model) -> Step | None:
    r = m.an.roles
    batch = next((g for g in r.batch_groups if g in m.infos), None)
    pair = next((g for g in r.pair_groups if g in m.infos), None)
    if batch is None and pair is None:
        return None
    parts = []
    if batch is not None:
        info = m.infos[batch]
        parts.append(f"{_b(info.label)} (size {info.size}) is the <b>batch</b>, shared by the data inputs "
                     f"({_tensors(info)}) and every activation made from them.")
    if pair is not None:
        info = m.infos[pair]
        layers = f", {info.layers} named dimensions: one per layer" if info.layers > 1 else ""
        parts.append(f"{_b(info.label)} (size {info.size}{layers}) is a <b>tensor-parallel pair</b>: one matmul "
                     f"makes it, the next contracts it. It holds {_tensors(info)}.")
    parts.append("The ops tie these dims together: shard one and the others must be <b>sharded alike</b>, so "
                 "<b>one decision</b> covers them all.")
    shown = pair if pair is not None else batch
    return Step("Named dimensions", " ".join(parts), "Decision", {"selected_group": shown})


def _conflict(m: _Model) -> Step | None:
    an = m.an
    c = next((c for c in an.conflicts if c.group in m.infos), None)
    if c is None:
        return None
    d = an.describe_conflict(c)
    a, b = d["dims"]
    path = " → ".join(f"<code>{esc(_op_text(p))}</code>" for p in d["path"])
    names = ("default", *(f"resolve:{k}" for k in RESOLUTIONS))
    priced = _resolution_costs(m, c.group)
    if priced is None:
        intro, costs = "The search picks a <b>resolution</b>:", [""] * len(names)
    else:
        sharded, costs = priced
        intro = f"The search picks a <b>resolution</b>; with {sharded} each costs:"
        costs = [f" — <i>{cost}</i>" for cost in costs]
    options = "".join(f"<li><b>{esc(name)}</b>: {esc(text)}{cost}</li>"
                      for name, text, cost in zip(names, d["options"], costs))
    body = (f"A {esc(d['producer'])} at <code>{esc(short_source(d['source']))}</code> makes a tensor of shape "
            f"{esc(tuple(d['shape']))} whose dims {a} and {b} are <b>both</b> in {_b(d['group'])} "
            f"({d['values']} tensors like it): one mesh axis cannot shard both. The ops that join them: {path}. "
            f"{intro}<ul>{options}</ul>")
    return Step(f"A conflict in {d['group']}", body, "Decision", {"selected_group": c.group})


def _op_text(p: str) -> str:
    prim, _, src = p.partition(" @ ")
    return f"{prim} @ {short_source(src)}" if src else prim


def _resolution_costs(m: _Model, g: int) -> tuple[str, list[str]] | None:
    """What group ``g`` sharded on top of data parallelism costs under each resolution (the
    default first): the kinds of collective it causes whose bytes differ between the
    resolutions, and the step time; with the decisions priced. None where no mesh axis
    divides the group."""
    an, mesh = m.an, m.ws.config.mesh
    base = [d for d in (m.baselines["dp"].decisions if "dp" in m.baselines else ())
            if not (isinstance(d, Shard) and d.group == g)]
    taken = {d.axis for d in base if isinstance(d, Shard)}
    fits = [a for a in mesh.axes if mesh.axis_size(a) > 1 and an.groups[g].size % mesh.axis_size(a) == 0]
    # an axis the batch leaves free: the conflict's own collectives are then not mixed with
    # what the batch and the group fighting over one axis cost
    axis = next((a for a in fits if a not in taken), fits[0] if fits else None)
    if axis is None:
        return None
    sharded: list[Decision] = [*base, Shard(g, axis)]
    plans = [sharded, *([*sharded, Resolve(g, k)] for k in RESOLUTIONS)]
    with m.ws.lock:  # the cost model caches as it goes
        reports = [m.ws.session.evaluate(p) for p in plans]
    label = an.groups[g].label
    totals = []
    for r in reports:
        t: dict[str, float] = {}  # collective kind -> bytes
        for c in r.collectives:
            if c.cause == label:
                t[c.kind] = t.get(c.kind, 0.0) + c.bytes * c.count
        totals.append(t)
    kinds = sorted({k for t in totals for k in t if len({u.get(k, 0.0) for u in totals}) > 1})
    costs = [(", ".join(f"{esc(k)} {fmt_bytes(t[k])}" for k in kinds if t.get(k)) or "none of those collectives")
             + f"; step {fmt_time(r.step_time)}" for t, r in zip(totals, reports)]
    return "<b>" + " + ".join(m.decision(d) for d in sharded) + "</b>", costs


def _data_parallel(m: _Model) -> Step | None:
    r = m.an.roles
    batch = next((g for g in r.batch_groups if m.axis_of("dp", g)), None)
    axis = None if batch is None else m.axis_of("dp", batch)
    if batch is None or axis is None:
        return None
    dp = m.baselines["dp"]
    # the batch is in no parameter: a backward op that sums over it makes a gradient
    c = (_caused(dp.report, m.label(batch), axis, r.forward_ops, inside=False)
         or _caused(dp.report, m.label(batch), axis, r.forward_ops, inside=True))
    if c is None:
        return None
    why = ("In the backward pass each device sums the gradients over its own share of the batch only; "
           "adding up the shares takes" if c.op not in r.forward_ops
           else "Each device sums over its own share of the batch; adding up the shares takes")
    decided = ", ".join(m.decision(d) for d in dp.decisions)
    body = (f"The <b>dp</b> baseline decides <b>{decided}</b>: each of the "
            f"{m.ws.config.mesh.axis_size(axis)} devices along {esc(axis)} takes its share of the batch, with "
            f"every parameter replicated. {why} {_collective(c)}, caused by {_b(m.label(batch))}. "
            f"All {len(dp.report.collectives)} collectives of this plan are in the Plan card, each with its cause "
            "and source line.")
    return Step("A decision becomes collectives", body, "Plan", {"shown_plan": "dp"})


def _tensor_parallel(m: _Model) -> Step | None:
    r = m.an.roles
    pair = next((g for g in r.pair_groups if m.axis_of("megatron", g)), None)
    axis = None if pair is None else m.axis_of("megatron", pair)
    if pair is None or axis is None:
        return None
    mg = m.baselines["megatron"]
    label = m.label(pair)
    fwd = _caused(mg.report, label, axis, r.forward_ops, inside=True)
    bwd = _caused(mg.report, label, axis, r.forward_ops, inside=False)
    if fwd is None and bwd is None:
        return None
    found = [f"in the forward pass by {_collective(fwd)}" if fwd else "",
             f"in the backward pass by {_collective(bwd)}" if bwd else ""]
    body = (f"<b>megatron</b> adds <b>{m.decision(Shard(pair, axis))}</b>: the matmul that makes {_b(label)} is split "
            f"by columns, the one that contracts it by rows. Each device then holds partial sums, added up "
            + " and ".join(f for f in found if f)
            + f". That is the price of storing 1/{m.ws.config.mesh.axis_size(axis)} of those weights per device.")
    return Step("Tensor parallelism", body, "Plan", {"shown_plan": "megatron"})


def _memory(m: _Model) -> Step | None:
    rep, z3 = m.baselines.get("replicated"), m.baselines.get("zero3")
    if rep is None or z3 is None:
        return None
    before = m.baselines.get("megatron", m.baselines.get("dp"))
    extra = [d for d in z3.decisions if before is None or d not in before.decisions]
    budget = m.ws.config.hw.budget

    def held(s: PlanSummary) -> str:
        b = s.report.memory.breakdown
        fits = "fits" if s.report.fits else "<b>over the budget</b>"
        return (f"parameters {fmt_bytes(b.get('parameters', 0))}, optimizer state "
                f"{fmt_bytes(b.get('optimizer', 0))}: peak <b>{fmt_bytes(s.report.memory.peak)}</b>, {fits}")

    added = ", ".join(m.decision(d) for d in extra)
    axes = ", ".join(esc(a) for a in dict.fromkeys(d.slot for d in extra))
    how = (f"<b>zero3</b> = {esc(before.name) + ' + ' if before else ''}<b>{added}</b>: parameters, gradients "
           f"and <b>optimizer state are sharded</b> over {axes} too, and gathered just before use"
           if extra else "<b>zero3</b> shards parameters, gradients and <b>optimizer state</b>")
    body = (f"The budget is {fmt_bytes(budget)} per device. <b>replicated</b>, every device holds everything: "
            f"{held(rep)}. {how}: {held(z3)}.")
    return Step("Memory per device", body, "Memory per device", {"shown_plan": "zero3"})


def _search(m: _Model) -> Step:
    an = m.an
    mesh = m.ws.config.mesh
    space = an.decision_space(len(mesh.axes))
    conflicted = an.conflicted_groups()
    resolutions = (f", and how to resolve the conflict{'s' if len(conflicted) > 1 else ''} in "
                   + ", ".join(_b(m.label(g)) for g in conflicted) if conflicted else "")
    over = [n for n, s in m.baselines.items() if not s.report.fits]
    named = ", ".join(_b(n) for n in over[:BASELINES_SHOWN]) + (
        f" and {len(over) - BASELINES_SHOWN} more" if len(over) > BASELINES_SHOWN else "")
    unfit = f" ({named} {'does' if len(over) == 1 else 'do'} not fit here)" if over else ""
    pair = next((g for g in an.roles.pair_groups if m.axis_of("megatron", g)), None)
    pair_axis = None if pair is None else m.axis_of("megatron", pair)
    example = f" (e.g. {m.decision(Shard(pair, pair_axis))})" if pair is not None and pair_axis else ""
    body = (f"<b>Monte Carlo tree search</b> explores ordered <b>(group, axis)</b> decisions: up to "
            f"{space['decisions']} here{resolutions}. Each simulation completes a plan and scores it on the cost "
            f"model; a plan over the {fmt_bytes(m.ws.config.hw.budget)} budget never wins{unfit}. Press "
            f"<b>Run</b> and watch the best step time fall. <b>Pin</b> a decision in the Decision card{example} "
            "and the search resumes from it, keeping what it learnt; <b>forbid</b> one to rule it out.")
    return Step("Search", body, "Search")


def _verify(m: _Model) -> Step | None:
    shown = "zero3" if "zero3" in m.baselines else next(iter(m.baselines), None)
    if shown is None:
        return None
    body = (f"The cost model is checked, not trusted. <b>Verify</b> compiles the shown plan (<b>{esc(shown)}</b>) "
            f"with <b>XLA</b> on {m.ws.config.mesh.size} simulated devices and puts XLA's peak memory and "
            "collective bytes beside the prediction. Each of XLA's collectives is traced to its "
            "<b>source line</b> and to the decision that caused it.")
    return Step("Predicted vs XLA", body, "Predicted vs XLA", {"shown_plan": shown})


def _compare(m: _Model) -> Step | None:
    a, b = m.baselines.get("megatron"), m.baselines.get("zero3")
    if a is None or b is None:
        return None
    ra, rb = a.report, b.report
    # the card's own sums: each collective's bytes times how often it runs
    comm_a, comm_b = (sum(c.bytes * c.count for c in r.collectives) for r in (ra, rb))
    trade = (" B <b>buys memory with communication</b>."
             if rb.memory.peak < ra.memory.peak and comm_b > comm_a else "")
    body = (f"<b>Compare</b> puts two plans side by side: what plan B changes against plan A, the decisions "
            f"that differ, memory by kind, and each collective's time. Here A is <b>megatron</b> and B is "
            f"<b>zero3</b>: step time {fmt_time(ra.step_time)} → {fmt_time(rb.step_time)}, peak "
            f"{fmt_bytes(ra.memory.peak)} → {fmt_bytes(rb.memory.peak)} per device, communication "
            f"{fmt_bytes(comm_a)} → {fmt_bytes(comm_b)} per step.{trade} When the walkthrough closes, the card "
            "goes back to the plans it showed before; choose <b>search</b> there to see what the search found.")
    return Step("Compare plans", body, "Compare", compare=("megatron", "zero3"))


# the steps in order; each returns None where the model lacks its subject
STEPS: tuple[Callable[[_Model], Step | None], ...] = (
    _traced, _named_dims, _conflict, _data_parallel, _tensor_parallel, _memory, _search, _verify, _compare,
)


# --------------------------------------------------------------------------- the view

class CompareChoice:
    """The Compare card's plans A and B, as a step chooses them and the walkthrough puts them
    back: the values of its selects, and whether the user had picked each (an unpicked one
    follows the card's defaults, A moving to the search's plan once there is one)."""

    def __init__(self, view):
        self.view = view

    def shown(self) -> tuple[str | None, str | None]:
        return self.view.a.value, self.view.b.value

    def save(self) -> tuple:
        return self.shown(), dict(self.view._picked)

    def show(self, a: str, b: str) -> None:
        """Show plans a and b, as if the user had picked them (the card keeps them while the
        step is shown, whatever the search finds)."""
        if a in self.view.a.options and b in self.view.b.options:
            self.view.a.value, self.view.b.value = a, b

    def restore(self, saved: tuple) -> None:
        (a, b), picked = saved
        self.show(a, b)
        self.view._picked.update(picked)
        self.view._refresh()  # an unpicked select takes the card's default again


class TeachView(pn.viewable.Viewer):
    """The walkthrough as a panel in the sidebar: the step's number, title and text, and Back /
    Next / Close. Hidden until ``start()``. Showing a step applies its action to the state (and
    its plans to the Compare card) and sets ``target`` (the page scrolls to that card and
    highlights it: see ``POINT_AT_CARD`` in ``_app``).

    What the steps change is put back when the walkthrough closes (Close, Finish on the last
    step, or another model loaded): the page is then as the user left it, but for what the
    user changed since (a plan they chose in the Plan card stays)."""

    state = param.Parameter()
    compare = param.Parameter(default=None, doc="A CompareChoice: the Compare card's plans A and B.")
    index = param.Integer(default=None, allow_None=True, doc="The step shown (from 0); None while closed.")
    target = param.String(default="", doc="""
        The title of the card the shown step points at; empty while closed. Triggered on every
        step shown, even when two steps in a row point at one card.""")

    WIDTH = 310  # fits in the sidebar (330 px)
    BELOW = 330  # the header and the sidebar's search controls above it: the rest of the window's height

    def __init__(self, **params):
        super().__init__(**params)
        self.steps: list[Step] = []
        self._stale = True  # the model changed since the steps were made
        self._model = None  # the analysed model the walkthrough opened on
        self._saved: dict[str, Any] = {}  # the state's params before the steps set them
        self._set: dict[str, Any] = {}  # what the steps set them to last
        self._saved_compare: tuple | None = None
        self._set_compare: tuple[str, str] | None = None
        self.head = html(name="partex-teach-head", margin=(4, 10, 0, 10))
        self.body = html(name="partex-teach-step", margin=(0, 10))
        self.back_btn = button("partex-teach-back", "◀ Back", width=82)
        self.next_btn = button("partex-teach-next", "Next ▶", color="primary", width=92)
        self.close_btn = button("partex-teach-close", "Close", width=70)
        clock = self.state.clock
        on_click(self.back_btn, clock, "the walkthrough's Back button", self.back)
        on_click(self.next_btn, clock, "the walkthrough's Next button", self.next)
        on_click(self.close_btn, clock, "the walkthrough's Close button", self.close)
        on_change(self.state, clock, "the walkthrough's model", self._on_model, ["workspace", "infos", "baselines"])
        # in the sidebar, below the search controls: it covers neither a card nor the sidebar's
        # forms (they move down while it shows); the buttons above the text: a long step scrolls
        # in the panel, they stay in view
        self._panel = pn.Column(
            self.head, pn.Row(self.back_btn, self.next_btn, pn.layout.HSpacer(), self.close_btn), self.body,
            visible=False, width=self.WIDTH, stylesheets=[CSS], css_classes=["px-card", "px-teach"],
            styles={"background": "#ffffff", "box-shadow": "0 4px 16px rgba(15, 23, 42, 0.16)",
                    "border": "2px solid #f59e0b", "border-radius": "10px", "overflow-y": "auto",
                    "max-height": f"calc(100vh - {self.BELOW}px)"})

    def __panel__(self):
        return self._panel

    @property
    def visible(self) -> bool:
        return self._panel.visible

    def _steps(self) -> list[Step]:
        if self._stale:
            self.steps = walkthrough(self.state)
            self._stale = False
        return self.steps

    def _on_model(self, *_) -> None:
        self._stale = True  # made again when next shown
        if self.index is None:
            return
        ws = self.state.workspace
        if ws is None or ws.res is not self._model:
            self.close()  # another model: the steps explained the one gone
            return
        steps = self._steps()  # the same model on another mesh or budget: its steps again, at once
        if steps:
            self.show_step(min(self.index, len(steps) - 1))
        else:
            self.close()

    def start(self) -> None:
        """Show step 1."""
        if not self._steps():
            self.state.notify("load a model first: the walkthrough explains the model on the page", "warning")
            return
        if self.index is None:  # opening: remember what the steps will change
            self._model = self.state.workspace.res
            names = {k for step in self.steps for k in step.action}
            self._saved = {k: getattr(self.state, k) for k in names}
            self._set = {}
            self._saved_compare = self.compare.save() if self.compare is not None else None
            self._set_compare = None
        self.show_step(0)

    def next(self) -> None:
        """The next step; on the last, Finish: close."""
        if self.index is None:
            return
        if self.index + 1 < len(self.steps):
            self.show_step(self.index + 1)
        else:
            self.close()

    def back(self) -> None:
        if self.index:
            self.show_step(self.index - 1)

    def close(self) -> None:
        """Hide the walkthrough and put back what its steps changed."""
        was_open = self.index is not None
        self._panel.visible = False
        self.param.update(index=None, target="")
        if was_open:
            self._restore()

    def _restore(self) -> None:
        s = self.state
        # a value the user changed since a step set it is theirs: kept
        back = {k: v for k, v in self._saved.items() if k in self._set and getattr(s, k) == self._set[k]}
        plan = back.get("shown_plan")
        if plan is not None and plan != "search" and s.plan_summary(plan) is None:
            back["shown_plan"] = "search"  # that plan is gone (another model)
        if back.get("selected_group") is not None and back["selected_group"] not in s.infos:
            back["selected_group"] = None
        s.param.update(**back)
        if (self.compare is not None and self._saved_compare is not None and self._set_compare is not None
                and self.compare.shown() == self._set_compare):
            self.compare.restore(self._saved_compare)
        self._saved, self._set, self._saved_compare, self._set_compare = {}, {}, None, None

    def show_step(self, i: int) -> None:
        """Show step ``i`` (from 0): set what it sets on the state, then point at its card."""
        steps = self._steps()
        step = steps[i]
        self.state.param.update(**step.action)
        self._set.update(step.action)
        if step.compare is not None and self.compare is not None:
            self.compare.show(*step.compare)
            self._set_compare = step.compare
        self.head.object = (f"<div class='muted'>Step {i + 1} of {len(steps)}</div>"
                            f"<h3 style='margin:2px 0 4px 0'>{esc(step.title)}</h3>")
        self.body.object = f"<div style='font-size:14px;line-height:1.42'>{step.body}</div>"
        self.back_btn.disabled = i == 0
        self.next_btn.label = "Finish ✓" if i == len(steps) - 1 else "Next ▶"
        self._panel.visible = True
        self.index = i
        if self.target == step.target:
            self.param.trigger("target")  # the same card again: highlight it again
        else:
            self.target = step.target
