"""A demo model with meaningless names: every dict key of its arguments renamed consistently to
``k000, k001, …`` (the same original key always gets the same new key), its positional
arguments called ``arg0, arg1, …`` and no logical axis names.

The new names keep the original keys' sort order (they are numbered in sorted order and
zero-padded), so the flattened leaves come in the same order: the renamed program is the same
program, and only its spellings differ. Anything partex decides differently for it read
meaning from a name.
"""

from __future__ import annotations

from typing import Any

from partex import LoadedModel
from partex.tracing._program import arg_names


def _keys(tree: Any, out: set[str]) -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _keys(v, out)


def _map_keys(tree: Any, mapping: dict[str, str]) -> Any:
    if isinstance(tree, dict):
        return {mapping[k]: _map_keys(v, mapping) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_map_keys(v, mapping) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_map_keys(v, mapping) for v in tree)
    return tree


class Renamed:
    """``model`` (a LoadedModel) with meaningless names; ``original_path`` maps a renamed
    pytree path (``arg0/k012/0/k031``) back to the original one (``params/layers/0/w1``)."""

    def __init__(self, model: LoadedModel):
        keys: set[str] = set()
        _keys(model.args, keys)
        width = len(str(max(len(keys) - 1, 0)))
        self.mapping = {k: f"k{i:0{width}d}" for i, k in enumerate(sorted(keys))}
        self.inverse = {v: k for k, v in self.mapping.items()}
        self.arg_names = arg_names(model.fn, len(model.args))
        fn, mapping, inverse = model.fn, self.mapping, self.inverse

        def step(*args):
            return _map_keys(fn(*_map_keys(args, inverse)), mapping)

        self.model = LoadedModel(f"{model.name}-renamed", step, _map_keys(tuple(model.args), mapping),
                                 None, model.preset, model.config)

    def original_path(self, path: str) -> str:
        head, *rest = path.split("/")
        assert head.startswith("arg"), path
        return "/".join([self.arg_names[int(head[3:])]] + [self.inverse.get(p, p) for p in rest])
