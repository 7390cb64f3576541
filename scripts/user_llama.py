"""A Llama as users write it: keys wq/wk/wv/wo/w_gate/w_up/w_down and no logical axis names
(the demo model's names are dropped), for checking that partex finds roles by structure::

    partex bench scripts/user_llama.py:make --mesh data=4,model=2 --memory 3MiB --budget 10
    LLAMA_PRESET=7b partex bench scripts/user_llama.py:make --mesh data=8,model=4 --budget 30
"""

from __future__ import annotations

import os

from partex import demo_models


def make():
    m = demo_models.build("llama", os.environ.get("LLAMA_PRESET", "tiny"))
    return m.fn, m.args
