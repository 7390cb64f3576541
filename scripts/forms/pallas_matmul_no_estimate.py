"""``pallas_matmul`` with no ``pl.CostEstimate``: partex counts the kernel's FLOPs from its
body, once per grid step (XLA is told nothing of a kernel without one).

    partex analyze scripts/forms/pallas_matmul_no_estimate.py:make
"""

from __future__ import annotations

import importlib.util
import os

_spec = importlib.util.spec_from_file_location("partex_form_pallas_matmul_base",
                                               os.path.join(os.path.dirname(os.path.abspath(__file__)), "pallas_matmul.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

MESH = _base.MESH
SIZES = _base.SIZES


def make(layers: int = 2, size: str = "tiny"):
    return _base.make(layers, size, estimate=False)
