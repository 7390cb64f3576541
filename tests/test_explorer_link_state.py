"""Links to a page's state without a browser: the query read into the forms' values and
written from the state in force (``partex.explorer._link``), and a page (``ExplorerState``)
opened on a link: the state it names, its saved session, and what of a bad one is refused."""

from __future__ import annotations

import pathlib
import time
import urllib.parse

import pytest

from partex.explorer._link import read_link
from partex.explorer._state import ExplorerState

DEFAULTS = {p: ExplorerState.param[p].default for p in ("model_name", "preset", "overrides", "custom_model",
                                                          "mesh_text", "hardware", "budget_text", "margin_text",
                                                          "pipeline_text", "seed")}


def _open(tmp_path, query: str, models_dir=None) -> ExplorerState:
    """A page opened on the link whose query is ``query``, once its model is on it (as the
    server hands it the query: name -> list of bytes); ``models_dir``: the folder the page
    loads models of its users' own from (None: none)."""
    args = {k: [x.encode() for x in v] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
    st = ExplorerState(sessions_dir=tmp_path, link=args, models_dir=models_dir)
    deadline = time.monotonic() + 120
    while not (st.phase == "ready" and not st.busy):
        assert time.monotonic() < deadline, "timed out waiting for the link's model"
        st.poll()
        time.sleep(0.05)
    return st


def test_a_link_query_reads_into_the_forms_values():
    link = read_link({"model": [b"transformer-scan"], "overrides": [b"layers=4"], "mesh": [b"data=2,model=4"],
                      "budget": [b"HBM"], "seed": [b"7"], "pin": [b"ffn->model", b"optimizer state->memory:host"],
                      "forbid": [b"vocab#2->data"]}, DEFAULTS, hardware=["tpu-v4"])
    # the model's first preset comes with it, and the link's budget (the chip's HBM: the form left empty)
    assert dict(link.form) == {"model_name": "transformer-scan", "preset": "tiny", "overrides": "layers=4",
                               "mesh_text": "data=2,model=4", "budget_text": "", "seed": 7}
    assert link.pins == (("ffn", "model"), ("optimizer state", "memory:host"))
    assert link.forbidden == (("vocab#2", "data"),) and link.decides and not link.problems
    # a full-size preset brings its own budget (the chip's HBM), as the form's preset does
    assert read_link({"model": "llama", "preset": "7b"}, DEFAULTS).form["budget_text"] == ""
    assert read_link({"preset": "tiny"}, DEFAULTS).form["budget_text"] == "3MiB"
    # an empty pin names none, and says the link decides them (a saved session's give way)
    none = read_link({"session": "run1", "pin": ""}, DEFAULTS)
    assert none.decides and none.pins == () and none.session == "run1"
    assert not read_link({"session": "run1"}, DEFAULTS).decides


@pytest.mark.parametrize("query, said", [
    ({"model": "gpt-9"}, "the link's model 'gpt-9' is none of the page's (mlp, transformer"),
    ({"model": "unet", "preset": "huge"}, "the link's preset 'huge' is not one of unet's (tiny, full): the page "
                                          "opened on tiny"),
    ({"hardware": "tpu-v9"}, "the link's hardware 'tpu-v9' is none of the page's (tpu-v4): the page is on tpu-v4"),
    ({"seed": "-1"}, "the link's seed '-1' is no whole number >= 0"),
    ({"pin": "ffn"}, "the link's pin 'ffn' is no decision: write GROUP->AXIS"),
    ({"forbid": "->data"}, "the link's forbid '->data' is no decision"),
    ({"utm_source": "mail"}, "the link's 'utm_source' is no parameter partex reads"),
    ({"model": "custom"}, "the link's model=custom names no model: add custom=module:attr"),
])
def test_what_a_link_names_that_no_form_holds_is_said_and_left_out(query, said):
    link = read_link(query, DEFAULTS, hardware=["tpu-v4"])
    assert len(link.problems) == 1 and said in link.problems[0], link.problems
    assert not {v for k, v in query.items() if k != "model" or v != "unet"} & set(map(str, link.form.values()))
    assert link.pins == link.forbidden == ()


def test_your_own_model_in_a_link_is_read_only_where_the_page_offers_it():
    query = {"model": "custom", "custom": "my_models.py:make_step"}
    # (with the budget the form gives your own model: the chip's HBM)
    assert read_link(query, DEFAULTS).form == {"model_name": "custom", "preset": "custom", "budget_text": "",
                                               "custom_model": "my_models.py:make_step"}
    shut = read_link(query, DEFAULTS, custom=False)
    assert shut.form == {} and "which this page does not load: the page opened on transformer" in shut.problems[0]


def test_a_link_opens_the_state_it_names_and_writes_the_same_link(tmp_path):
    """Every field a link carries (a mesh with its links' bandwidths, the margin, a pipeline,
    the seed, a label with '#'): the page opens on them, and its own link is the one opened."""
    query = ("model=transformer-scan&preset=tiny&overrides=layers=4&mesh=stage=2@25,data=2@25,model=2@100"
             "&hardware=tpu-v5e&budget=16MiB&margin=0.2&pipeline=stack0:stage:4&seed=3&pin=ffn-%3Emodel"
             "&pin=vocab%232-%3Emodel&forbid=heads-%3Edata")
    st = _open(tmp_path, query)
    try:
        assert st.message_level == "success" and st.message.startswith("opened a link: transformer-scan (tiny) "
                                                                       "[layers=4]"), st.message
        ws, config = st.workspace, st.config
        assert ws.choice.to_json() == {"spec": "transformer-scan", "preset": "tiny", "overrides": ["layers=4"]}
        assert config.to_json() == {"mesh": "stage=2,data=2,model=2", "hardware": "tpu-v5e", "budget": 16 * 2**20,
                                    "margin": 0.2, "pipeline": "stack0:stage:4"}
        assert config.mesh.text(links=True) == "stage=2@25,data=2@25,model=2@100" and ws.session.seed == 3
        label = ws.an.decision_label
        assert [label(d) for d in st.pins] == ["ffn->model", "vocab#2->model"]
        assert [label(d) for d in st.forbidden] == ["heads->data"]
        # the forms show it, and the search starts from the pins (the session the runner forks has them)
        assert (st.model_name, st.overrides, st.mesh_text, st.budget_text, st.margin_text, st.seed) == (
            "transformer-scan", "layers=4", "stage=2@25,data=2@25,model=2@100", "16MiB", "0.2", 3)
        assert [label(d) for d in ws.session.pins] == ["ffn->model", "vocab#2->model"]
        assert st.link == query
    finally:
        st.close()


def test_a_link_carries_recompute_and_host_memory_pins_and_the_chips_hbm(tmp_path):
    query = ("model=transformer-scan&preset=tiny&overrides=layers=4&mesh=data=4,model=2&hardware=tpu-v4&budget=hbm"
             "&pin=stack0-%3Erecompute:full&pin=optimizer+state-%3Ememory:host&forbid=heads-%3Edata")
    st = _open(tmp_path, query)
    try:
        assert st.message_level == "success", st.message
        assert st.config.hw.memory_budget is None and st.budget_text == ""
        assert st.link == query
    finally:
        st.close()


def test_a_bad_link_is_said_marked_at_its_fields_and_the_rest_applies(tmp_path):
    """A mesh that does not parse and an override key the model has not: each field keeps the
    link's text, marked as a refused input's, and the page opens on the default in its place;
    a pin the model lacks is said and left; the rest of the link applies."""
    st = _open(tmp_path, "model=transformer&overrides=no_such_key=3&mesh=data=four&budget=8MiB&hardware=a100-40gb"
                         "&pin=ffn-%3Emodel&pin=nope-%3Emodel")
    try:
        assert st.message_level == "warning"
        for said in ("the link's mesh 'data=four' was not applied (cannot parse mesh",
                     "the page opened on data=4,model=2",
                     "the link's config overrides 'no_such_key=3' were not applied",
                     "the page opened on transformer (tiny)",
                     "the link's pin nope->model was not applied: unknown dimension 'nope'"):
            assert said in st.message, (said, st.message)
        assert set(st.field_error) == {"mesh", "overrides"}, st.field_error
        assert (st.mesh_text, st.overrides) == ("data=four", "no_such_key=3")  # as typed, marked
        assert st.workspace.choice.overrides == () and st.config.mesh.text() == "data=4,model=2"
        assert st.config.hw.name == "a100-40gb" and st.config.hw.budget == 8 * 2**20
        assert [st.workspace.an.decision_label(d) for d in st.pins] == ["ffn->model"]
        # the page's own link is the state in force, not the link's refused values
        assert st.link == ("model=transformer&preset=tiny&mesh=data=4,model=2&hardware=a100-40gb&budget=8MiB"
                           "&pin=ffn-%3Emodel")
        # fixed at the field, the mark goes as a typed one's does
        st.mesh_text = "data=2,model=4"
        deadline = time.monotonic() + 120
        while st.busy or st.config.mesh.text() != "data=2,model=4":
            assert time.monotonic() < deadline
            st.poll()
            time.sleep(0.05)
        assert set(st.field_error) == {"overrides"}
    finally:
        st.close()


@pytest.mark.parametrize("folder, custom, said", [
    (False, "os:abort", "which this page does not load"),  # no models folder: no model of your own at all
    (True, "os:abort", "is not a Python file in the models folder"),
    (True, "no_such_file.py:make_step", "does not exist in"),
])
def test_your_own_model_that_does_not_load_opens_the_default_page(tmp_path, folder, custom, said):
    """A link's own model goes through the page's models folder as a typed one does: where
    the server allows none, or the file is not in its folder, the link's model is refused,
    said, and the page opens on the default model with the rest of the link."""
    models = tmp_path / "models"
    models.mkdir()
    st = _open(tmp_path, f"model=custom&custom={custom}&mesh=data=8", models_dir=models if folder else None)
    try:
        assert st.workspace.choice.spec == "transformer" and st.config.mesh.text() == "data=8"
        assert said in st.message + " ".join(st.field_error.values()), (st.message, st.field_error)
        assert "transformer (tiny)" in st.message, st.message
    finally:
        st.close()


def test_a_link_to_a_saved_session_resumes_it_with_the_links_pins(tmp_path):
    st = _open(tmp_path, "pin=ffn-%3Emodel")
    try:
        st.step_size = 30
        st.step()
        while st.stats.simulations < 30:
            st.poll()
            time.sleep(0.05)
        st.session_name = "run1"
        st.save_session()
        while "saved session run1" not in st.message:  # the search writes it between two chunks
            st.poll()
            time.sleep(0.05)
    finally:
        st.close()
    # the session with the link's decisions in place of its own
    st = _open(tmp_path, "session=run1&pin=heads-%3Emodel&forbid=ffn-%3Edata")
    try:
        assert st.opened_session == "run1" and "opened a link: loaded session run1" in st.message, st.message
        label = st.workspace.an.decision_label
        assert [label(d) for d in st.pins] == ["heads->model"] and [label(d) for d in st.forbidden] == ["ffn->data"]
        assert st.link.endswith("&session=run1&pin=heads-%3Emodel&forbid=ffn-%3Edata"), st.link
    finally:
        st.close()
    # a link that names no decision keeps the session's; its own mesh, not the session's, is said
    st = _open(tmp_path, "session=run1&mesh=data=8")
    try:
        assert [st.workspace.an.decision_label(d) for d in st.pins] == ["ffn->model"]
        assert "the link's mesh 'data=8' is not session run1's: its 'data=4,model=2' is shown" in st.message
        assert st.config.mesh.text() == "data=4,model=2" and st.message_level == "warning"
    finally:
        st.close()
    # only names inside the sessions folder; a session not there, or that does not load: the rest
    # of the link applies
    (tmp_path / "broken.json").write_text('{"format": "partex-session", "ver')
    for name, said in (("../run1", "session name '../run1': use letters"),
                       ("run2", "no session 'run2' is saved here (saved: broken, run1)"),
                       ("broken", "the link's session broken did not load (")):
        st = _open(tmp_path, f"session={urllib.parse.quote(name)}&mesh=data=8")
        try:
            assert said in st.message and st.opened_session == "" and st.config.mesh.text() == "data=8", st.message
            assert st.mesh_text == "data=8" and st.message_level == "warning"
        finally:
            st.close()


def test_the_readmes_link_opens_what_it_says(tmp_path):
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    url = next(line for line in readme.splitlines() if line.startswith("http://HOST:5006/app?"))
    st = _open(tmp_path, url.partition("?")[2])
    try:
        assert st.message_level == "success", st.message
        assert st.workspace.choice.overrides == ("layers=4",) and st.config.hw.name == "tpu-v4"
        label = st.workspace.an.decision_label
        assert [label(d) for d in st.pins] == ["ffn->model"] and [label(d) for d in st.forbidden] == ["heads->data"]
    finally:
        st.close()
