"""The sidebar's forms as the page reads and writes them (``Forms``)."""

from __future__ import annotations

import param

from partex import ModelSpec, PartexError, Pipeline, as_mesh, demo_models, parse_bytes

from ._banner import CONFIG_FIELDS, MODEL_FIELDS, Banner
from ._engine import (CUSTOM, Config, ModelFolder, Workspace, demo_presets, hardware_of, parse_config,
                      split_overrides)
from ._format import fmt_bytes
from ._loading import budget_words, default_budget
from ._slice import ParamSlice

# the forms' parameters that ``Forms`` reads and writes (a saved session's forms name them all)
FORM_PARAMS = ("model_name", "preset", "overrides", "custom_model", "mesh_text", "hardware", "budget_text",
               "margin_text", "pipeline_text", "seed")
# the configuration's parameters (a change applies at once: ``ExplorerState.apply_config``)
CONFIG_PARAMS = ("mesh_text", "hardware", "budget_text", "margin_text", "pipeline_text")


def _read(fn):
    """fn(), or None where what the form holds does not read."""
    try:
        return fn()
    except (PartexError, ValueError):
        return None


def read_choice(model_name: str, preset: str, overrides: str, custom_model: str) -> ModelSpec:
    """The model the model form's values name (PartexError, with its field, where one is
    malformed)."""
    if model_name == CUSTOM:
        spec = custom_model.strip()
        if not spec:
            raise PartexError("name your model as module:attr or path/file.py:attr (a callable that "
                              "returns (fn, example_args))", field="custom")
        return ModelSpec(spec, "custom", ())
    items = split_overrides(overrides)
    try:  # malformed (no key=value) at once; unknown keys and bad values when it loads
        demo_models.parse_overrides(items)
    except ValueError as e:
        raise PartexError(str(e), field="overrides") from None
    return ModelSpec(model_name, preset, tuple(items))


def field_value(config: Config | None, field: str) -> str:
    """The value in force of a configuration field (one of ``_banner.CONFIG_FIELDS``), as the
    page says it; "" for another field."""
    if config is None:
        return "nothing loaded"
    hw, pipe = config.hw, config.pipeline
    return {"mesh": config.mesh.text(links=True), "hardware": hw.name, "budget": fmt_bytes(hw.budget),
            "margin": f"{hw.memory_margin:g}", "pipeline": pipe.text() if pipe is not None else "none"}.get(field, "")


def config_words(config: Config) -> str:
    """A configuration in words: 'stage=2,fsdp=4 with pipeline stack0:stage:4 (tpu-v4, budget
    16.0 MiB)'."""
    pipe = f" with pipeline {config.pipeline.text()}" if config.pipeline is not None else ""
    return f"{config.mesh.text(links=True)}{pipe} ({config.hw.name}, budget {fmt_bytes(config.hw.budget)})"


class Forms:
    """Reads the forms (the model they name, ``choice``; the configuration, ``config``) and
    writes them for the page (``write``: a saved session's forms, a mesh picked in the Meshes
    card) while their watchers stand by (``quiet``). Owns the budget that follows the preset
    while the user has not typed one, and the note that another model loads only on Analyze.
    ``page``: the forms' parameters (set) and ``workspace`` (read); ``preset``: the preset
    selector, whose choices follow the model; ``models``: the folder a user's own model may
    come from."""

    def __init__(self, page: ParamSlice, banner: Banner, preset: param.Selector, models: ModelFolder):
        self.page = page
        self.banner = banner
        self.preset = preset
        self.models = models
        self.quiet = False  # set while the page writes the forms

    def choice(self) -> ModelSpec:
        """The model in the forms (PartexError, with its field, where it is malformed)."""
        page = self.page
        if page.model_name == CUSTOM:
            return self.models.choice(page.custom_model)
        return read_choice(page.model_name, page.preset, page.overrides, page.custom_model)

    def config(self) -> Config:
        """The mesh, hardware, budget, margin and pipeline in the forms (PartexError, with its
        field, for a bad one)."""
        page = self.page
        return parse_config(page.mesh_text, page.hardware, page.budget_text, page.margin_text, page.pipeline_text)

    def unapplied(self, config: Config | None) -> list[str]:
        """The configuration fields whose value in the form is not the one in force in
        ``config`` (a value that does not read at all is not), each read on its own."""
        if config is None:
            return []
        page, hw = self.page, config.hw
        chip = _read(lambda: hardware_of(page.hardware))  # its own budget and margin: the empty fields'
        typed = {
            "mesh": _read(lambda: as_mesh(page.mesh_text)),
            "hardware": chip.name if chip is not None else page.hardware,
            "budget": (_read(lambda: parse_bytes(page.budget_text)) if page.budget_text.strip() else
                       chip.budget if chip is not None else None),
            "margin": (_read(lambda: float(page.margin_text)) if page.margin_text.strip() else
                       chip.memory_margin if chip is not None else None),
            "pipeline": _read(lambda: Pipeline.parse(page.pipeline_text.strip())) if page.pipeline_text.strip() else None,
        }
        in_force = {"mesh": config.mesh, "hardware": hw.name, "budget": hw.budget, "margin": hw.memory_margin,
                    "pipeline": config.pipeline}
        unread = {f for f in ("mesh", "pipeline") if typed[f] is None and getattr(page, f"{f}_text").strip()}
        return [f for f in CONFIG_FIELDS if f in unread or typed[f] != in_force[f]]

    def names(self, choice: ModelSpec) -> bool:
        """Whether the model picker names ``choice`` (its overrides aside)."""
        page = self.page
        if page.model_name == CUSTOM:
            return choice.preset == "custom" and _read(lambda: self.models.choice(page.custom_model)) == choice
        return page.model_name == choice.spec and page.preset == choice.preset

    def say_analyze(self, budget: str = "") -> None:
        """Say that the model the form names loads only on Analyze (with the budget it comes
        with, ``budget``), and which the page still shows; said aside: once the form names the
        page's model again, the line it replaced comes back."""
        page = self.page
        ws = page.workspace
        what = (page.custom_model or "your model" if page.model_name == CUSTOM else
                f"{page.model_name} ({page.preset})")
        overrides = split_overrides(page.overrides) if page.model_name != CUSTOM else []
        with_overrides = f" with {','.join(overrides)}" if overrides else ""
        self.banner.aside(f"press Analyze to load {what}{with_overrides}{budget}; the page still shows "
                          f"{ws.choice.title if ws else 'nothing'}", "info")

    def write(self, form: dict) -> None:
        """Write the forms (name -> value); their watchers leave it be (what it loads or
        applies comes with it)."""
        self.quiet = True
        try:
            for k, v in form.items():
                if k == "preset":
                    self.preset.objects = demo_presets(form.get("model_name", self.page.model_name))
                setattr(self.page, k, v)
        finally:
            self.quiet = False

    def loaded(self, ws: Workspace) -> None:
        """``ws`` is on the page: the marks of the forms that read well go (a bad value typed
        while it loaded keeps its mark)."""
        self.banner.clear("session")
        try:
            self.config()
            self.banner.clear(*CONFIG_FIELDS)
        except PartexError:
            pass
        try:  # the form's model is the one loaded: its fields are good too
            if self.choice() == ws.choice:
                self.banner.clear(*MODEL_FIELDS)
        except PartexError:
            pass

    # ------------------------------------------------------------------ the forms' watchers
    def model_named(self, event) -> None:
        """Another model: the preset picker offers its presets; the model on the page named
        again comes with its own preset."""
        presets = demo_presets(event.new)
        self.preset.objects = presets
        ws = self.page.workspace
        if ws is not None and ws.choice.spec == event.new and ws.choice.preset in presets:
            self.page.preset = ws.choice.preset
        elif self.page.preset not in presets:
            self.page.preset = presets[0]

    def choice_changed(self, event) -> None:
        """The model or preset in the form changed: nothing is analysed until Analyze, so say
        so; and the budget follows the preset while the user has not typed one (3 MiB suits
        the tiny demos; a full-size preset opens on the chip's HBM, not on "no plan fits")."""
        if self.quiet:
            return
        page = self.page
        self.banner.clear(*MODEL_FIELDS)  # another model: its fields are checked anew on Analyze
        budget = ""
        if (event.name == "preset" and page.budget_text == default_budget(event.old)
                and default_budget(event.new) != page.budget_text):
            self.write({"budget_text": default_budget(event.new)})  # the form only: it applies with the new model
            hbm = hardware_of(page.hardware).budget
            budget = ", " + budget_words(parse_bytes(page.budget_text) if page.budget_text else hbm,
                                         page.hardware, page.preset)
        ws = page.workspace
        if ws is not None and self.names(ws.choice):
            if budget:
                self.banner.aside(f"press Analyze to load {ws.choice.title} again{budget}", "info")
            else:
                self.banner.back()  # the form names the page's model again: nothing waits for Analyze
            return
        self.say_analyze(budget)
