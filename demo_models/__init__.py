"""Demo models for partex: full training steps (loss, grads, Adam) in plain JAX.

    model = build("transformer", "tiny", {"layers": "2"})
    new_params, new_opt_state, loss = model.fn(*model.args)

`model.args = (params, opt_state, batch)`: real f32 arrays for the "tiny" preset,
`jax.ShapeDtypeStruct`s (nothing allocated) for every other preset.  `model.axis_names`
has the structure of `model.args` with a tuple of logical axis names (str or None) per
leaf.  Names used: batch, seq, d_model, heads, head_dim, ffn, vocab, experts, capacity
(internal only), channels, in_channels, height, width, nodes, edges, features,
out_features, hidden, layers, kv_heads.  No leaf repeats a name.
"""

from __future__ import annotations

from typing import Any, Mapping

from ._common import DemoModelError, Model, ModelDef, build_model, parse_overrides
from ._gns import GNS
from ._llama import LLAMA, PUBLISHED_RUNS
from ._mlp import MLP
from ._moe import MOE
from ._transformer import TRANSFORMER, TRANSFORMER_SCAN
from ._unet import UNET

MODELS: dict[str, ModelDef] = {
    m.name: m for m in (MLP, TRANSFORMER, TRANSFORMER_SCAN, UNET, GNS, MOE, LLAMA)
}


def build(name: str, preset: str = "tiny", overrides: Mapping[str, Any] | None = None) -> Model:
    """Build demo model `name` at `preset` with `overrides` ({"layers": "2"}, values parsed)."""
    if name not in MODELS:
        raise DemoModelError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return build_model(MODELS[name], preset, overrides)


__all__ = ["MODELS", "build", "parse_overrides", "DemoModelError", "Model", "ModelDef"]
