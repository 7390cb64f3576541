"""Links that open a page on a state: ``/app?model=transformer&preset=tiny&mesh=data=4,model=2
&hardware=tpu-v4&budget=3MiB&pin=ffn->model&forbid=heads->data``.

A link's query names what the sidebar's forms hold and the decisions the user fixed:

- ``model``: a demo model, or ``custom`` with ``custom=module:attr`` (where the page offers
  your own model); ``preset``; ``overrides`` (``layers=4,batch=16``);
- ``mesh``, ``hardware``, ``budget`` (``3MiB``; ``hbm``: the chip's HBM), ``margin``,
  ``pipeline``, ``seed``, as the forms spell them;
- ``pin`` and ``forbid``, once per decision, as the page labels decisions (``ffn->model``);
- ``session``: a search saved in the sessions folder, by name, resumed.

A parameter left out keeps the page's default (the budget follows the preset, as the form's
does). ``read_link`` reads a query (``pn.state.session_args``) into a ``Link``; ``settle``
takes the forms' values, each refused one falling back to the default page's; ``build_link``
and ``restore_link`` are the load jobs that open it (what of the link does not apply said in
the page's message, the forms that did not read marked as a refused input's); ``link_query``
writes the query of the state on the page; ``Links`` does both for a page. Nothing here
touches Panel.
"""

from __future__ import annotations

import dataclasses
import pathlib
import urllib.parse
from typing import Any, Callable, Mapping, Sequence

from partex import ModelSpec, PartexError, as_mesh, demo_models, parse_bytes

from ._engine import CUSTOM, Config, ModelFolder, Workspace, demo_presets, parse_config, split_overrides
from ._forms import read_choice
from ._loading import Analyses, Loaded, _build, _restore, budget_text, default_budget
from ._slice import ParamSlice
from ._store import SessionStore

# The query's parameters, in the order a link writes them: each once, but ``pin`` and
# ``forbid``, once per decision.
PARAMS = ("model", "preset", "custom", "overrides", "mesh", "hardware", "budget", "margin", "pipeline", "seed",
          "session", "pin", "forbid")
# the form parameter (``ExplorerState``'s) each parameter of a link sets
FORM_OF = {"model": "model_name", "preset": "preset", "custom": "custom_model", "overrides": "overrides",
           "mesh": "mesh_text", "hardware": "hardware", "budget": "budget_text", "margin": "margin_text",
           "pipeline": "pipeline_text", "seed": "seed"}
# the form field (``_banner.FORM_FIELDS``) a form parameter is shown in, and its name in words
FIELD_OF = {"overrides": "overrides", "custom_model": "custom", "mesh_text": "mesh", "hardware": "hardware",
            "budget_text": "budget", "margin_text": "margin", "pipeline_text": "pipeline"}
WORDS = {"overrides": "config overrides", "custom": "model", "mesh": "mesh", "hardware": "hardware",
         "budget": "budget", "margin": "margin", "pipeline": "pipeline"}
HBM = "hbm"  # the budget: the chip's HBM (the budget form left empty)
SAFE = ",:=@/"  # left as they are in a query: a link stays readable (">" and "#" are escaped)
Decided = tuple[tuple[str, str], ...]  # (group label, slot) per decision, as ``Session.pin`` reads them


@dataclasses.dataclass(frozen=True)
class Link:
    """What a link names. ``form``: the form parameters it sets (``ExplorerState``'s names),
    those it implies included (a model's first preset, the preset's budget); ``given``: the
    link's own parameters; ``pins`` and ``forbidden``: the decisions it fixes, in order;
    ``decides``: whether it names them (a ``pin`` or ``forbid`` parameter, an empty one for
    none), which a saved session's then give way to; ``session``: a saved session's name;
    ``problems``: what of it was not read, in words."""

    form: Mapping[str, Any]
    given: frozenset[str] = frozenset()
    pins: Decided = ()
    forbidden: Decided = ()
    decides: bool = False
    session: str = ""
    problems: tuple[str, ...] = ()


def _values(query: Mapping[str, Any]) -> dict[str, list[str]]:
    """A query (``pn.state.session_args``: name -> list of bytes; or name -> text) as name ->
    list of text."""
    out = {}
    for k, v in query.items():
        items = v if isinstance(v, (list, tuple)) else [v]
        out[str(k)] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in items]
    return out


def _decision(how: str, text: str) -> tuple[str, str] | str:
    """'ffn->model' -> ('ffn', 'model'); what is wrong with it, in words, where it is no decision."""
    group, arrow, slot = text.strip().rpartition("->")
    if not arrow or not group.strip() or not slot.strip():
        return (f"the link's {how} {text!r} is no decision: write GROUP->AXIS, as the page labels "
                "decisions (e.g. ffn->model)")
    return group.strip(), slot.strip()


def read_link(query: Mapping[str, Any], defaults: Mapping[str, Any], *, custom: bool = True,
              hardware: Sequence[str] = ()) -> Link:
    """The state a link's ``query`` names. ``defaults``: the forms' default values (the page
    a link that names nothing opens); ``custom``: whether the page offers your own model;
    ``hardware``: the hardware field's choices. A value no form could hold (an unknown model,
    preset or hardware, a parameter partex does not read, a pin that is no ``GROUP->AXIS``)
    is left out and said in ``problems``; the forms check the rest (``settle``)."""
    values = _values(query)
    problems = [f"the link's {k!r} is no parameter partex reads" for k in values if k not in PARAMS]
    one = {k: v[-1].strip() for k, v in values.items() if k in FORM_OF or k == "session"}
    form: dict[str, Any] = {}
    # the model
    model, preset = one.get("model", ""), one.get("preset")
    if model == CUSTOM or (not model and "custom" in one):
        if not custom:
            problems.append(f"the link names your own model {one.get('custom', '')!r}, which this page does not "
                            f"load: the page opened on {defaults['model_name']}")
        elif not one.get("custom"):
            problems.append("the link's model=custom names no model: add custom=module:attr")
        else:
            form.update(model_name=CUSTOM, preset="custom", custom_model=one["custom"])
    elif model and model not in demo_models.MODELS:
        problems.append(f"the link's model {model!r} is none of the page's ({', '.join(demo_models.MODELS)}): "
                        f"the page opened on {defaults['model_name']}")
    elif model:
        form["model_name"] = model
    name = form.get("model_name", defaults["model_name"])
    if name != CUSTOM:
        presets = demo_presets(name)
        if preset and preset not in presets:
            problems.append(f"the link's preset {preset!r} is not one of {name}'s ({', '.join(presets)}): the "
                            f"page opened on {presets[0]}")
            preset = None
        if preset or "model_name" in form:
            form["preset"] = preset or presets[0]
        if "overrides" in one:
            form["overrides"] = one["overrides"]
    # the configuration: its texts as the forms hold them (``settle`` reads them)
    for key in ("mesh", "margin", "pipeline"):
        if key in one:
            form[FORM_OF[key]] = one[key]
    if "budget" in one:
        form["budget_text"] = "" if one["budget"].lower() == HBM else one["budget"]
    elif "preset" in form:  # the budget follows the preset, as the form's does
        form["budget_text"] = default_budget(form["preset"])
    if "hardware" in one:
        if hardware and one["hardware"] not in hardware:
            problems.append(f"the link's hardware {one['hardware']!r} is none of the page's "
                            f"({', '.join(hardware)}): the page is on {defaults['hardware']}")
        else:
            form["hardware"] = one["hardware"]
    if "seed" in one:
        if one["seed"].isdigit():
            form["seed"] = int(one["seed"])
        else:
            problems.append(f"the link's seed {one['seed']!r} is no whole number >= 0: the search's seed is "
                            f"{defaults['seed']}")
    decided: dict[str, list[tuple[str, str]]] = {"pin": [], "forbid": []}
    for how in decided:
        for text in values.get(how, []):
            if not text.strip():
                continue  # an empty one names none: the link decides, and decides nothing
            d = _decision(how, text)
            if isinstance(d, str):
                problems.append(d)
            else:
                decided[how].append(d)
    return Link(form, frozenset(k for k in values if k in PARAMS), tuple(decided["pin"]), tuple(decided["forbid"]),
                "pin" in values or "forbid" in values, one.get("session", ""), tuple(problems))


def link_query(ws: Workspace | None, pins: Sequence[str], forbidden: Sequence[str], defaults: Mapping[str, Any],
               saved: str = "") -> str:
    """The query of a link to the state on the page (empty while there is none): the model
    and configuration in force (``ws``), the pins and forbids (labels, ``ffn->model``), the
    saved session the page's search is (``saved``). The margin and seed only where they are
    not the forms' ``defaults``."""
    if ws is None:
        return ""
    choice, config = ws.choice, ws.config
    hw = config.hw
    items = [("model", choice.spec), ("preset", choice.preset)] if choice.spec in demo_models.MODELS else \
        [("model", CUSTOM), ("custom", choice.spec)]
    if choice.overrides:
        items.append(("overrides", ",".join(choice.overrides)))
    items += [("mesh", config.mesh.text(links=True)), ("hardware", hw.name),
              ("budget", budget_text(hw.memory_budget) or HBM)]
    if hw.memory_margin != float(defaults["margin_text"] or hw.memory_margin):
        items.append(("margin", f"{hw.memory_margin:g}"))
    if config.pipeline is not None:
        items.append(("pipeline", config.pipeline.text()))
    if ws.session.seed != defaults["seed"]:
        items.append(("seed", str(ws.session.seed)))
    if saved:
        items.append(("session", saved))
    items += [("pin", p) for p in pins] + [("forbid", f) for f in forbidden]
    if saved and not pins and not forbidden:
        items.append(("pin", ""))  # none: the session's own pins and forbids are released
    return urllib.parse.urlencode(items, safe=SAFE)


# --------------------------------------------------------------------------- opening a link

@dataclasses.dataclass(frozen=True)
class Opening:
    """A link's state as the page opens it: the model (``choice``) and configuration the forms
    name, the refused values replaced by the default page's (``marks``: field -> why; ``notes``:
    what the page says of each), the decisions to fix, and the default page's model and
    configuration (what a link that does not load at all opens)."""

    choice: ModelSpec
    config: Config
    pins: Decided
    forbidden: Decided
    marks: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    default_choice: ModelSpec
    default_config: Config


def _choice(v: Mapping[str, Any], own: Callable[[str], ModelSpec] | None = None) -> ModelSpec:
    """The model the forms' values ``v`` name; your own model as ``own`` reads it (the page's
    models folder: ``ModelFolder.choice``; None: as written)."""
    if own is not None and v["model_name"] == CUSTOM:
        return own(v["custom_model"])
    return read_choice(v["model_name"], v["preset"], v["overrides"], v["custom_model"])


def _config(v: Mapping[str, Any]) -> Config:
    return parse_config(v["mesh_text"], v["hardware"], v["budget_text"], v["margin_text"], v["pipeline_text"])


def settle(link: Link, values: Mapping[str, Any], defaults: Mapping[str, Any],
           own: Callable[[str], ModelSpec] | None = None) -> Opening:
    """The model and configuration the forms' ``values`` (the link's written over the
    defaults) name, each value the forms refuse replaced by the default page's (``defaults``):
    your own model refused (as ``own`` reads it: ``_choice``), by the default model; a budget,
    by the preset's."""
    v = dict(values)
    marks: dict[str, str] = {}
    notes = list(link.problems)
    for _ in range(len(FIELD_OF) + 1):  # each refusal replaces one field's value: one round per field at most
        try:
            return Opening(_choice(v, own), _config(v), link.pins, link.forbidden, tuple(marks.items()), tuple(notes),
                           _choice(defaults), _config(defaults))
        except PartexError as e:
            field = e.field or ""
            key = next((k for k, f in FIELD_OF.items() if f == field), None)
            if key is None or field in marks:
                raise
            marks[field] = str(e)
            if key == "custom_model":
                v.update({k: defaults[k] for k in ("model_name", "preset", "overrides")})
                now = _choice(v).title
            else:
                v[key] = default_budget(v["preset"]) if key == "budget_text" else defaults[key]
                now = v[key] or ("the chip's HBM" if key == "budget_text" else "none")
            notes.append(f"the link's {WORDS[field]} {values[key]!r} was not applied ({e}): the page opened "
                         f"on {now}")
    raise AssertionError("unreachable: a refused field falls back once, to a value that reads")


def build_link(opening: Opening, seed: int, analyses: Analyses) -> Loaded:
    """The load job of a link (``Opening``): its model on its configuration, its decisions
    fixed. Where the model does not build (an override it has no such key for, your own model
    not found, a pipeline it cannot run), the page opens on what does (the model without
    them; the default page), and says why; a decision that does not apply is said and left.
    Every model comes from ``analyses`` (the page's one gate: ``ModelFolder.analysis``)."""
    choice, config = opening.choice, opening.config
    marks, notes = dict(opening.marks), list(opening.notes)
    while True:
        try:
            loaded = _build(choice, config, seed, analyses)
            break
        except PartexError as e:
            field = e.field
            if field == "overrides" and choice.overrides and field not in marks:
                choice = dataclasses.replace(choice, overrides=())
                notes.append(f"the link's config overrides {','.join(opening.choice.overrides)!r} were not applied "
                             f"({e}): the page opened on {choice.title}")
            elif field == "pipeline" and config.pipeline is not None and field not in marks:
                notes.append(f"the link's pipeline {config.pipeline.text()!r} was not applied ({e}): the page "
                             "opened with none")
                config = dataclasses.replace(config, pipeline=None)
            elif field == "custom" and choice != opening.default_choice and field not in marks:
                choice = opening.default_choice
                notes.append(f"the link's model {opening.choice.spec!r} did not load ({e}): the page opened on "
                             f"{choice.title}")
            elif (choice, config) != (opening.default_choice, opening.default_config):
                choice, config = opening.default_choice, opening.default_config
                notes.append(f"the link's {opening.choice.title} on {opening.config.mesh.text()} did not load "
                             f"({e}): the page opened on {choice.title}")
            else:
                raise
            if field in WORDS:
                marks[field] = str(e)
    session = loaded.session
    for how, decided in (("pin", opening.pins), ("forbid", opening.forbidden)):
        for group, slot in decided:
            try:
                getattr(session, how)(group, slot)
            except PartexError as e:
                notes.append(f"the link's {how} {group}->{slot} was not applied: {e}")
    return dataclasses.replace(loaded, notes=(*loaded.notes, *notes), marks=tuple(marks.items()),
                               origin="opened a link")


def restore_link(link: Link, name: str, path: pathlib.Path, rest: Opening, seed: int, analyses: Analyses) -> Loaded:
    """The load job of a link to a saved session (``name``, its file ``path``): the session,
    its search resumed; the link's pins and forbids, where it names them, in place of the
    session's. Where the link's own model or configuration is not the session's, the page
    says so (the session's is shown). A session that does not load: the rest of the link
    (``rest``, with ``seed``), its forms shown."""
    try:
        loaded = _restore(name, path, analyses)
    except PartexError as e:
        why = f"the link's session {name} did not load ({e}): the page opened on the rest of the link"
        opened = build_link(dataclasses.replace(rest, notes=(*rest.notes, why)), seed, analyses)
        return dataclasses.replace(opened, form=dict(link.form))
    session, saved = loaded.session, loaded.form or {}
    notes = list(link.problems)
    if link.decides:
        label = session.analysis.decision_label
        want = {"pin": [f"{g}->{s}" for g, s in link.pins], "forbid": [f"{g}->{s}" for g, s in link.forbidden]}
        for how, have in (("pin", session.pins), ("forbid", session.forbidden)):
            for d in have:
                if label(d) not in want[how]:
                    session.unpin(d.id, d.slot)
        for how, decided in (("pin", link.pins), ("forbid", link.forbidden)):
            have = {label(d) for d in (session.pins if how == "pin" else session.forbidden)}
            for group, slot in decided:
                if f"{group}->{slot}" in have:
                    continue
                try:
                    getattr(session, how)(group, slot)
                except PartexError as e:
                    notes.append(f"the link's {how} {group}->{slot} was not applied: {e}")
    for key in sorted(link.given & FORM_OF.keys(), key=PARAMS.index):
        param = FORM_OF[key]
        if param in link.form and not _same(param, link.form[param], saved.get(param, "")):
            shown = saved.get(param, "")
            shown = repr(shown) if shown != "" else "the chip's HBM" if param == "budget_text" else "none"
            notes.append(f"the link's {key} {link.form[param]!r} is not session {name}'s: its {shown} is shown")
    return dataclasses.replace(loaded, notes=(*loaded.notes, *notes), origin=f"opened a link: {loaded.origin}")


def _same(param: str, a: Any, b: Any) -> bool:
    """Whether two values of the form ``param`` say the same (``data=4, model=2`` and
    ``data=4,model=2``; ``3MiB`` and ``3145728``)."""
    read = {"mesh_text": lambda t: as_mesh(t), "budget_text": lambda t: parse_bytes(t) if t else None,
            "margin_text": float, "overrides": split_overrides}.get(param, str)
    try:
        return read(a) == read(b)
    except (PartexError, ValueError):
        return str(a) == str(b)


# --------------------------------------------------------------------------- the page's links

class Links:
    """The page's links: opens the state a link names (``open``), and keeps the link to the
    state on the page (``relink``). ``page``: the state's ``link`` (set), and its forms'
    parameters, ``sessions``, ``workspace``, ``pins``, ``forbidden`` and ``opened_session``
    (read); ``defaults``: the forms' values on a page opened with no link; ``store``: the
    sessions folder (a link names a session in it only); ``write_forms``: writes the forms
    (``Forms.write``); ``load(build, coming)``: puts what a job builds on the page
    (``Loading.open``); ``models``: the folder the page's own models come from
    (``ModelFolder``: whether it offers them, how it reads them and the gate every model
    passes); ``hardware``: the hardware field's choices."""

    def __init__(self, page: ParamSlice, defaults: Mapping[str, Any], store: SessionStore,
                 write_forms: Callable[[dict], None], load: Callable[[Callable[[], Loaded], Config | None], None],
                 *, models: ModelFolder, hardware: Sequence[str]):
        self.page = page
        self.defaults = dict(defaults)
        self.store = store
        self.write_forms = write_forms
        self.load = load
        self.models = models
        self.hardware = list(hardware)

    def open(self, query: Mapping[str, Any]) -> None:
        """Open the state a link's ``query`` names: its model on its mesh, hardware and budget
        with its pins and forbids, or its saved session. What of it is refused is said in the
        page's message and marked at its field, as a refused input's (the page opens on the
        default in its place); the rest applies."""
        page, defaults = self.page, self.defaults
        link = read_link(query, defaults, custom=self.models.folder is not None, hardware=self.hardware)
        path = None
        if link.session:
            try:
                path = self.store.path(link.session)
            except PartexError as e:
                why = str(e)
            else:
                why = "" if path.is_file() else (f"no session {link.session!r} is saved here (saved: "
                                                 f"{', '.join(page.sessions) or 'none'})")
            if why:
                path, link = None, dataclasses.replace(link, problems=(*link.problems, f"the link's session: {why}"))
        values = {**{p: getattr(page, p) for p in defaults}, **link.form}
        opening = settle(link, values, defaults, self.models.choice)
        if path is not None:  # the session brings its own forms (the link's, should it not load)
            name, seed = link.session, values["seed"]
            self.load(lambda: restore_link(link, name, path, opening, seed, self.models.analysis), None)
            return
        self.write_forms(dict(link.form))
        self.load(lambda: build_link(opening, values["seed"], self.models.analysis), opening.config)

    def relink(self, *_) -> None:
        """Write the link to the state on the page (the state's ``link``)."""
        page = self.page
        ws = page.workspace
        label = ws.an.decision_label if ws is not None else str
        page.link = link_query(ws, [label(d) for d in page.pins], [label(d) for d in page.forbidden], self.defaults,
                               page.opened_session)
