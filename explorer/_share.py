"""The sidebar's Link section (``LinkControls``): a link to the state on the page (``_link``),
shown in a field the user can select, and a Copy link button that puts it in the clipboard."""

from __future__ import annotations

import panel as pn
import param

from ._widgets import button, html, keyed, on_change

# The Copy link button, in the page: the clipboard where the browser allows it (a secure
# context: https, or localhost), else the link selected in its field and copied the old way
# (``execCommand``), else left selected for Ctrl+C; the note under the button says which.
COPY_LINK = """
const url = field.value;
const say = (text) => { note.text = `<div class='hint' style='color:#1e3a8a'>${text}</div>`; };
if (!url) { say("no link yet: the model is still loading"); return; }
function input() {
  const walk = (root) => {
    for (const el of root.querySelectorAll("input, textarea")) if (el.value === url) return el;
    for (const el of root.querySelectorAll("*")) {
      if (el.shadowRoot) { const hit = walk(el.shadowRoot); if (hit) return hit; }
    }
    return null;
  };
  return walk(document);
}
function select() {
  const el = input();
  if (el) { el.focus(); el.select(); }
  return el;
}
function oldWay() {
  let copied = false;
  try { copied = !!select() && document.execCommand("copy"); } catch (e) { copied = false; }
  say(copied ? "✓ copied to the clipboard" : "selected above: copy it with Ctrl+C (⌘C); this browser lets " +
      "a page write the clipboard on https or localhost only");
}
if (navigator.clipboard && window.isSecureContext) {
  navigator.clipboard.writeText(url).then(() => { select(); say("✓ copied to the clipboard"); }, oldWay);
} else {
  oldWay();
}
"""

MONOSPACE = (":host textarea { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; "
             "font-size: 11.5px; line-height: 1.35; word-break: break-all; }")


LINE_CHARS = 40  # the link's characters on one line of its field, in the sidebar
MAX_ROWS = 8


def base_url(href: str) -> str:
    """The page's address less its query and fragment ('' where the page has none yet)."""
    return href.split("#", 1)[0].split("?", 1)[0]


class LinkControls(pn.viewable.Viewer):
    """A link that opens the page as it is: the model, preset and overrides, the mesh,
    hardware and budget, the pins and forbids, the saved session loaded (the state's
    ``link``), on this server's address (``pn.state.location``, as the browser has it)."""

    state = param.Parameter()

    def __init__(self, **params):
        super().__init__(**params)
        s = self.state
        self.location = pn.state.location
        self.field = keyed(pn.widgets.TextAreaInput)(
            "partex-link", label="Link to this page", rows=2, max_rows=MAX_ROWS, resizable=False,
            sizing_mode="stretch_width", stylesheets=[MONOSPACE],
            description="Opens the page on this model, preset, overrides, mesh, hardware, budget, pins and "
                        "forbids (and the saved session loaded): for a class, or a colleague on this server")
        self.copy = button("partex-copy-link", "Copy link", color="primary", variant="outline",
                           sizing_mode="stretch_width", disabled=True)
        self.note = html(name="partex-link-note", margin=(0, 10))
        self.copy.js_on_click(args={"field": self.field, "note": self.note.div}, code=COPY_LINK)
        # the field shows the link, whatever is typed in it
        on_change(self.field, s.clock, "the link field", lambda e: self._show(), ["value"])
        on_change(s, s.clock, "the link", lambda e: self._show(), ["link"])
        if self.location is not None:
            on_change(self.location, s.clock, "the page's address", lambda e: self._show(), ["href"])
        self._show()
        self._panel = pn.Column(
            html("<div class='side-title'>Link</div>", margin=(10, 10, 0, 10)), self.field, self.copy, self.note,
            sizing_mode="stretch_width", css_classes=["side-section"])

    def url(self) -> str:
        """The link's full address ('' while the page has no model)."""
        query = self.state.link
        if not query:
            return ""
        return f"{base_url(self.location.href if self.location is not None else '')}?{query}"

    def _show(self) -> None:
        url = self.url()
        if self.field.value != url:
            # all of it in view, a line per LINE_CHARS (the field grows with typing only)
            self.field.param.update(value=url, rows=max(2, min(MAX_ROWS, -(-len(url) // LINE_CHARS))))
        self.copy.disabled = not url

    def __panel__(self):
        return self._panel
