"""Every relative link in README.md and docs/*.md resolves: the file it names exists and, for a
``#anchor``, the page has a heading whose GitHub slug is that anchor. Pure Python, no network:
links to other sites are not followed."""

from __future__ import annotations

import pathlib
import re

import pytest

from conftest import ROOT

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the text may hold brackets one level deep
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(].*?[\"')])?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (code spans' text, a link's text, no
    emphasis marks), lower case, every character but letters, digits, '_', '-' and spaces
    dropped, spaces as '-'."""
    text = INLINE_CODE.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*]|(?<!\w)_+|_+(?!\w)", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def links(path: pathlib.Path):
    """(line number, target) of every link in the page's prose."""
    for n, line in _prose(path.read_text()):
        line = INLINE_CODE.sub("", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)
        m = REFERENCE.match(line)
        if m:
            yield n, m.group(1)


def broken(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    bad = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # another site (http:, https:, mailto:): not followed
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(root)}:{n}: {target}"
        if not dest.exists():
            bad.append(f"{where}: no file {dest.relative_to(root) if dest.is_relative_to(root) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading with the anchor #{anchor} in {dest.relative_to(root)}")
    return bad


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken(page), "\n".join(broken(page))


def test_the_slugs_are_githubs():
    assert slug("Which line of my code made this collective? (`verify --explain`)") == (
        "which-line-of-my-code-made-this-collective-verify---explain")
    assert slug("`shard_map` regions") == "shard_map-regions"
    assert slug("Against jax.experimental.roofline") == "against-jaxexperimentalroofline"
    assert slug("partex's own speed") == "partexs-own-speed"
    assert slug("Exports: what a plan file carries without partex") == (
        "exports-what-a-plan-file-carries-without-partex")


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\n```sh\n# not a heading\n[x](nope.md)\n```\n"
                                   "[ok](#two-words) [ok](a.md#title) [bad](#not-a-heading) [gone](b.md) "
                                   "`[code](c.md)` [web](https://example.com/x.md)\n")
    assert [b.split(": ", 1)[1] for b in broken(tmp_path / "a.md", tmp_path)] == [
        "#not-a-heading: no heading with the anchor #not-a-heading in a.md", "b.md: no file b.md"]


def test_the_readme_stays_a_front_page():
    """README.md is what partex is, how to install it, a quick start and where to read more
    (at most 250 lines); the reference lives in docs/, which it links."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    linked = {target.split("#")[0] for _, line in _prose(text) for target in LINK.findall(line)}
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= linked
