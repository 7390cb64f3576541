// partex explorer: keep every resource on this server.
//
// Panel and Bokeh name their CSS and JS by CDN address (cdn.holoviz.org, cdn.bokeh.org) and
// swap in the local path (static/extensions/panel/..., static/js/...) when the page is
// rendered for a server. A component whose stylesheets are resolved outside that step (some
// Panel releases do this for components added while the page is busy) keeps the CDN address,
// which fails on an air-gapped cluster and leaks requests elsewhere. This script runs in the
// page's head, before Bokeh builds any view, and maps those addresses onto the same files the
// server serves itself, for <link> and <script> elements in the document and in shadow roots.
(function () {
  "use strict";
  const RULES = [
    // https://cdn.holoviz.org/panel/1.10.0/dist/css/button.css -> static/extensions/panel/css/button.css
    [/^https?:\/\/cdn\.holoviz\.org\/panel\/[^/]+\/dist\//, "static/extensions/panel/"],
    // https://cdn.bokeh.org/bokeh/release/bokeh-widgets-3.10.2.min.js -> static/js/bokeh-widgets.min.js
    [/^https?:\/\/cdn\.bokeh\.org\/bokeh\/(?:release|dev)\/([a-z-]+?)-\d[^/]*?(\.min)?\.js(\?.*)?$/, "static/js/$1$2.js"],
  ];
  function local(url) {
    if (typeof url !== "string") return url;
    for (const [pattern, to] of RULES) {
      if (pattern.test(url)) {
        const rewritten = url.replace(pattern, to);
        window.partexRewritten = (window.partexRewritten || 0) + 1;
        return new URL(rewritten, document.baseURI).href;
      }
    }
    return url;
  }
  function guard(proto, attr) {
    const desc = Object.getOwnPropertyDescriptor(proto, attr);
    if (!desc || !desc.set) return;
    Object.defineProperty(proto, attr, {
      configurable: true, enumerable: desc.enumerable, get: desc.get,
      set(value) { desc.set.call(this, local(value)); },
    });
  }
  guard(HTMLLinkElement.prototype, "href");
  guard(HTMLScriptElement.prototype, "src");
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if ((this instanceof HTMLLinkElement && name === "href") || (this instanceof HTMLScriptElement && name === "src"))
      value = local(String(value));
    return setAttribute.call(this, name, value);
  };
})();
