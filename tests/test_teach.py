"""Teach, the explorer's guided walkthrough, without a browser: every step points at a card
of the page, says what is true of the loaded model (its counts, its groups, its conflict,
the collectives and memory of its baselines), and the view's Back / Next apply each step's
action to the state. On the mlp, which has no conflict, the conflict's step is left out."""

from __future__ import annotations

import html.parser

import pytest
from bokeh.document import Document

from partex import RESOLUTIONS
from partex.explorer._engine import short_source
from partex.explorer._format import esc, fmt_bytes, fmt_time
from partex.explorer._loop import PageClock
from partex.explorer._state import ExplorerState
from partex.explorer._compare import CompareView
from partex.explorer._teach import CARDS, CompareChoice, TeachView, walkthrough
from test_explorer_state import wait_for

ALLOWED_TAGS = {"b", "i", "code", "ul", "li"}


def _settle(st: ExplorerState, until, what: str, timeout: float = 120.0):
    def check():
        st.poll()
        return until()
    return wait_for(check, timeout=timeout, what=what)


def _loaded(st: ExplorerState, model: str) -> ExplorerState:
    _settle(st, lambda: (st.phase == "ready" and not st.busy and st.runner is not None
                         and st.workspace.choice.spec == model), f"{model} to load")
    return st


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """The explorer's default: the tiny transformer on data=4,model=2."""
    st = ExplorerState(sessions_dir=tmp_path_factory.mktemp("sessions"))
    try:
        yield _loaded(st, "transformer")
    finally:
        st.close()


def _by_title(steps, start: str):
    found = [s for s in steps if s.title.startswith(start)]
    assert len(found) == 1, [s.title for s in steps]
    return found[0]


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)


def test_the_steps_come_in_order_each_pointing_at_a_card(state):
    steps = walkthrough(state)
    assert [s.target for s in steps] == ["Named dimensions", "Decision", "Decision", "Plan", "Plan",
                                         "Memory per device", "Search", "Predicted vs XLA", "Compare"]
    assert all(s.target in CARDS for s in steps)
    for s in steps:
        # the model's own text is escaped: a source such as "<gather>" never becomes a tag
        parser = _Tags()
        parser.feed(s.body)
        assert parser.tags <= ALLOWED_TAGS, (s.title, parser.tags)
        assert set(s.action) <= set(state.param), s.action


def test_the_first_step_counts_what_was_traced(state):
    an = state.workspace.an
    s = an.summary()
    body = walkthrough(state)[0].body
    axes = len(state.workspace.config.mesh.axes)
    assert f"<b>{s['ops']:,} ops</b>" in body
    assert f"<b>{len(an.named_dims)} named dimensions</b>" in body
    assert f"<b>{len(an.decision_groups)} decision groups</b>" in body
    assert f"<b>{len(an.decision_groups) * axes} decisions</b>" in body
    assert "1 conflict needs" in body and len(an.conflicts) == 1


def test_the_named_dimensions_step_shows_the_batch_and_a_tensor_parallel_pair(state):
    an = state.workspace.an
    roles = an.roles
    batch, pair = roles.batch_groups[0], roles.pair_groups[0]
    step = _by_title(walkthrough(state), "Named dimensions")
    assert step.action == {"selected_group": pair}
    for g in (batch, pair):
        info = state.infos[g]
        assert f"<b>{esc(info.label)}</b> (size {info.size}" in step.body
        path, _, dim = info.tensors[0]
        assert f"<code>{esc(path)}</code> dim {dim}" in step.body
    assert f"and {len(state.infos[pair].tensors) - 3} more" in step.body
    assert "sharded alike" in step.body


def test_the_conflict_step_names_its_group_and_prices_each_resolution(state):
    ws = state.workspace
    an = ws.an
    c = an.conflicts[0]
    d = an.describe_conflict(c)
    step = _by_title(walkthrough(state), "A conflict")
    assert step.action == {"selected_group": c.group}
    label = an.groups[c.group].label
    assert step.title == f"A conflict in {label}" and f"<b>{esc(label)}</b>" in step.body
    assert f"{esc(tuple(d['shape']))} whose dims {d['dims'][0]} and {d['dims'][1]}" in step.body
    for name, option in zip(["default", *(f"resolve:{k}" for k in RESOLUTIONS)], d["options"]):
        assert f"<li><b>{name}</b>: {esc(option)}" in step.body
    # priced on top of dp, with the conflicted group on the axis the batch leaves free
    sharded = [*state.baselines["dp"].decisions, (c.group, "model")]
    for extra in [[], *([(c.group, f"resolve:{k}")] for k in RESOLUTIONS)]:
        with ws.lock:
            report = ws.session.evaluate(sharded + extra)
        assert f"step {fmt_time(report.step_time)}</i>" in step.body


def _named_collective(body: str, report, label: str, ops, inside: bool):
    """The collective of ``report`` caused by ``label`` that ``body`` describes."""
    found = [c for c in report.collectives
             if c.cause == label and (c.op in ops) == inside
             and f"<b>{c.kind}</b> over {', '.join(c.axes)} of {fmt_bytes(c.bytes)}" in body
             and f"<code>{esc(short_source(c.source))}</code>" in body]
    assert found, body
    return found[0]


def test_the_collective_steps_name_collectives_of_the_baselines_with_their_cause(state):
    an = state.workspace.an
    roles = an.roles
    steps = walkthrough(state)
    dp = _by_title(steps, "A decision becomes collectives")
    assert dp.action == {"shown_plan": "dp"}
    batch = an.groups[roles.batch_groups[0]].label
    assert f"decides <b>{batch} → data</b>" in dp.body
    # the gradient all-reduce: a backward op, over the data axis
    c = _named_collective(dp.body, state.baselines["dp"].report, batch, roles.forward_ops, inside=False)
    assert c.kind == "all-reduce" and c.axes == ("data",)

    tp = _by_title(steps, "Tensor parallelism")
    assert tp.action == {"shown_plan": "megatron"}
    pair = an.groups[roles.pair_groups[0]].label
    assert f"<b>{pair} → model</b>" in tp.body
    report = state.baselines["megatron"].report
    fwd = _named_collective(tp.body, report, pair, roles.forward_ops, inside=True)
    bwd = _named_collective(tp.body, report, pair, roles.forward_ops, inside=False)
    assert {fwd.kind, bwd.kind} == {"all-reduce"} and fwd.axes == bwd.axes == ("model",)


def test_the_memory_step_puts_replicated_beside_zero3(state):
    step = _by_title(walkthrough(state), "Memory per device")
    assert step.action == {"shown_plan": "zero3"}
    for name in ("replicated", "zero3"):
        m = state.baselines[name].report.memory
        assert f"peak <b>{fmt_bytes(m.peak)}</b>" in step.body
        assert f"parameters {fmt_bytes(m.breakdown['parameters'])}" in step.body
        assert f"optimizer state {fmt_bytes(m.breakdown['optimizer'])}" in step.body
    assert not state.baselines["replicated"].report.fits and "over the budget" in step.body
    assert "<b>d_model → data</b>" in step.body  # what zero3 adds to megatron


def test_next_and_back_walk_the_steps_and_apply_their_actions(state):
    view = TeachView(state=state)
    assert not view.visible and view.index is None
    targets = []
    view.param.watch(lambda e: targets.append(e.new), ["target"])
    view.start()
    steps = view.steps
    assert view.visible and view.index == 0 and view.target == "Named dimensions"
    assert view.back_btn.disabled and not view.next_btn.disabled
    assert f"Step 1 of {len(steps)}" in view.head.object
    for i, step in enumerate(steps[1:], start=1):
        view.next()
        assert view.index == i and view.target == step.target
        assert step.body in view.body.object
        for name, value in step.action.items():
            assert getattr(state, name) == value, (step.title, name)
    assert view.next_btn.label == "Finish ✓" and not view.next_btn.disabled
    assert targets == [s.target for s in steps]  # one event per step, even on the same card twice

    conflict = next(i for i, s in enumerate(steps) if s.title.startswith("A conflict"))
    while view.index > conflict:
        view.back()
    assert state.selected_group == state.workspace.an.conflicts[0].group
    assert f"Step {conflict + 1} of {len(steps)}" in view.head.object
    view.back()
    assert state.selected_group == state.workspace.an.roles.pair_groups[0]
    assert view.next_btn.label == "Next ▶"
    view.close()
    assert not view.visible and view.index is None and view.target == ""


def test_on_the_mlp_the_conflict_step_is_left_out_and_another_model_closes_the_walkthrough(tmp_path):
    st = _loaded(ExplorerState(sessions_dir=tmp_path), "transformer")
    try:
        view = TeachView(state=st)
        view.start()
        view.next()
        view.next()
        assert view.steps[view.index].title.startswith("A conflict")
        assert st.selected_group is not None
        st.model_name = "mlp"
        st.load()
        _loaded(st, "mlp")
        # the steps explained the transformer: closed, what they set put back
        assert not view.visible and view.index is None and view.target == ""
        assert st.selected_group is None and st.shown_plan == "search"
        an = st.workspace.an
        assert not an.conflicts
        view.start()
        steps = view.steps
        assert [s.target for s in steps] == ["Named dimensions", "Decision", "Plan", "Plan",
                                             "Memory per device", "Search", "Predicted vs XLA", "Compare"]
        assert not any(s.title.startswith("A conflict") for s in steps)
        assert f"<b>{len(an.decision_groups)} decision groups</b>" in steps[0].body
        roles = an.roles
        assert steps[1].action == {"selected_group": roles.pair_groups[0]}
        batch = an.groups[roles.batch_groups[0]].label
        _named_collective(steps[2].body, st.baselines["dp"].report, batch, roles.forward_ops, inside=False)
        pair = an.groups[roles.pair_groups[0]].label
        _named_collective(steps[3].body, st.baselines["megatron"].report, pair, roles.forward_ops, inside=True)
        for step in steps[1:]:
            view.next()
            for name, value in step.action.items():
                assert getattr(st, name) == value, (step.title, name)
        # the same model on another mesh: the walkthrough stays open, its steps made again
        st.mesh_text = "data=2,model=4"
        _settle(st, lambda: st.config.mesh.text() == "data=2,model=4" and not st.busy, "the new mesh")
        assert view.visible and view.index == len(steps) - 1 and view.steps is not steps
        view.next()  # Finish
        assert not view.visible and st.shown_plan == "search" and st.selected_group is None
    finally:
        st.close()


def _walk_to(view: TeachView, start: str) -> None:
    view.start()
    while not view.steps[view.index].title.startswith(start):
        view.next()


def test_closing_the_walkthrough_puts_back_the_plan_the_group_and_the_compared_plans(state):
    """Teach sets the Plan card's plan (zero3 at the end), the selected group and the Compare
    card's A and B; Close and Finish put back what the user had, so Verify verifies the
    plan the user chose, not the walkthrough's."""
    compare = CompareView(state=state)
    view = TeachView(state=state, compare=CompareChoice(compare))
    an = state.workspace.an
    batch = an.roles.batch_groups[0]
    state.param.update(shown_plan="dp", selected_group=batch)
    before = (compare.a.value, compare.b.value, dict(compare._picked))
    assert before[:2] != ("megatron", "zero3")
    changed = set()
    view.start()
    for _ in view.steps[1:]:
        view.next()
        changed |= {k for k in ("shown_plan", "selected_group") if getattr(state, k) != {"shown_plan": "dp",
                                                                                           "selected_group": batch}[k]}
    assert changed == {"shown_plan", "selected_group"}  # the steps did change both
    assert (compare.a.value, compare.b.value) == ("megatron", "zero3")
    view.next()  # Finish
    assert not view.visible
    assert state.shown_plan == "dp" and state.selected_group == batch
    assert (compare.a.value, compare.b.value, compare._picked) == before

    # Close half-way; a plan the user chose while a step showed its own stays theirs
    view.start()
    while state.shown_plan != "megatron":
        view.next()
    state.shown_plan = "replicated"
    view.close()
    assert state.shown_plan == "replicated" and state.selected_group == batch
    state.param.update(shown_plan="search", selected_group=None)


def test_the_compare_step_says_what_the_compare_card_shows(state):
    """After its action the Compare card shows megatron as A and zero3 as B; the step names
    them so and quotes the card's own figures."""
    compare = CompareView(state=state)
    view = TeachView(state=state, compare=CompareChoice(compare))
    _walk_to(view, "Compare")
    step = view.steps[view.index]
    assert (compare.a.value, compare.b.value) == ("megatron", "zero3") == step.compare
    assert "A is <b>megatron</b> and B is <b>zero3</b>" in step.body
    assert "Pick the search" not in step.body
    a, b = (state.baselines[n].report for n in ("megatron", "zero3"))
    head, colls = compare.head.object, compare.colls.view.object
    for shown, quoted in (
            (f"{fmt_time(a.step_time)} → {fmt_time(b.step_time)}", f"step time {fmt_time(a.step_time)} → "
                                                                   f"{fmt_time(b.step_time)}"),
            (f"{fmt_bytes(a.memory.peak)} → {fmt_bytes(b.memory.peak)} per device",
             f"peak {fmt_bytes(a.memory.peak)} → {fmt_bytes(b.memory.peak)} per device")):
        assert shown in head and quoted in step.body, (shown, head)
    comm = [fmt_bytes(sum(c.bytes * c.count for c in r.collectives)) for r in (a, b)]
    assert f"communication {comm[0]} → {comm[1]} per step" in step.body
    assert all(f">{c}<" in colls or f"{c}<" in colls for c in comm), colls
    view.close()


def test_before_a_model_is_loaded_the_walkthrough_does_not_open():
    st = ExplorerState.__new__(ExplorerState)  # the params alone: no model loaded, no search
    ExplorerState.__base__.__init__(st)
    st.clock = PageClock("t")  # the page's clock, which times the view's callbacks
    assert walkthrough(st) == []
    view = TeachView(state=st)
    view.start()
    assert not view.visible and view.index is None
    assert st.message_level == "warning" and "load a model" in st.message


def test_the_view_renders_with_keyed_models_hidden_until_started(state):
    view = TeachView(state=state)
    doc = Document()
    root = view.__panel__().get_root(doc)
    doc.add_root(root)
    models = {k: doc.get_model_by_name(k) for k in ("partex-teach-back", "partex-teach-next",
                                                    "partex-teach-close", "partex-teach-step")}
    assert all(m is not None for m in models.values()), models
    assert not root.visible
    view.start()
    assert root.visible and view.steps[0].body in models["partex-teach-step"].text
    view.next()
    assert view.steps[1].body in models["partex-teach-step"].text
    view.close()
    assert not root.visible
