"""The sidebar's forms as the page reads and writes them (``Forms``)."""

from __future__ import annotations

import param

from partex import ModelSpec, PartexError, demo_models, parse_bytes

from ._banner import CONFIG_FIELDS, MODEL_FIELDS, Banner
from ._engine import CUSTOM, Config, Workspace, demo_presets, hardware_of, parse_config, split_overrides
from ._loading import budget_words, default_budget
from ._slice import ParamSlice

# the forms' parameters that ``Forms`` reads and writes (a saved session's forms name them all)
FORM_PARAMS = ("model_name", "preset", "overrides", "custom_model", "mesh_text", "hardware", "budget_text",
               "margin_text", "pipeline_text", "seed")


class Forms:
    """Reads the forms (the model they name, ``choice``; the configuration, ``config``) and
    writes them for the page (``write``: a saved session's forms, a mesh picked in the Meshes
    card) while their watchers stand by (``quiet``). Owns the budget that follows the preset
    while the user has not typed one, and the note that another model loads only on Analyze.
    ``page``: the forms' parameters (set) and ``workspace`` (read); ``preset``: the preset
    selector, whose choices follow the model."""

    def __init__(self, page: ParamSlice, banner: Banner, preset: param.Selector):
        self.page = page
        self.banner = banner
        self.preset = preset
        self.quiet = False  # set while the page writes the forms

    def choice(self) -> ModelSpec:
        """The model in the forms (PartexError, with its field, where it is malformed)."""
        page = self.page
        if page.model_name == CUSTOM:
            spec = page.custom_model.strip()
            if not spec:
                raise PartexError("name your model as module:attr or path/file.py:attr (a callable that "
                                  "returns (fn, example_args))", field="custom")
            return ModelSpec(spec, "custom", ())
        overrides = split_overrides(page.overrides)
        try:  # malformed (no key=value) at once; unknown keys and bad values when it loads
            demo_models.parse_overrides(overrides)
        except ValueError as e:
            raise PartexError(str(e), field="overrides") from None
        return ModelSpec(page.model_name, page.preset, tuple(overrides))

    def config(self) -> Config:
        """The mesh, hardware, budget, margin and pipeline in the forms (PartexError, with its
        field, for a bad one)."""
        page = self.page
        return parse_config(page.mesh_text, page.hardware, page.budget_text, page.margin_text, page.pipeline_text)

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
        """Another model: the preset picker offers its presets."""
        presets = demo_presets(event.new)
        self.preset.objects = presets
        if self.page.preset not in presets:
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
        if ws is not None and ws.choice.spec == page.model_name and ws.choice.preset == page.preset:
            if budget:
                self.banner.notify(f"press Analyze to load {ws.choice.title} again{budget}", "info")
            return
        what = page.custom_model or "your model" if page.model_name == CUSTOM else f"{page.model_name} ({page.preset})"
        self.banner.notify(f"press Analyze to load {what}{budget}; the page still shows "
                           f"{ws.choice.title if ws else 'nothing'}", "info")
