"""``PARTEX_CHECKOUT=<dir>``: import partex from another checkout's folders, so that a script
measures two versions of partex from one virtualenv (before and after a change)."""

from __future__ import annotations

import importlib.util
import os
import sys


class _Checkout:
    """Finds ``partex`` and its subpackages in a checkout (pyproject's package-dir mapping)."""

    FOLDERS = {"partex": "engine", "partex.explorer": "explorer", "partex.demo_models": "demo_models",
               "partex.static": "static"}

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name not in self.FOLDERS:
            return None
        folder = os.path.join(self.root, self.FOLDERS[name])
        return importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


def use_checkout_from_env() -> None:
    """Before partex is imported: take it from ``$PARTEX_CHECKOUT`` where that is set."""
    root = os.environ.get("PARTEX_CHECKOUT")
    if root:
        sys.meta_path.insert(0, _Checkout(os.path.abspath(root)))
