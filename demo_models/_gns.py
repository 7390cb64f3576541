"""GNS-style graph network (Sanchez-Gonzalez et al. 2020): encode-process-decode.

MLP encoders for node and edge features; K unshared message-passing steps in which each
edge gathers its sender and receiver node latents (`x[senders]`, a gather), updates its
latent with an MLP, and the messages are summed onto receivers with `jax.ops.segment_sum`
(a scatter-add); a node MLP then updates the nodes.  Residual latents, LayerNorm after
every MLP but the decoder.  MSE loss on per-node targets (e.g. accelerations).

The first layer of an MLP over several inputs is written as a sum of per-input matmuls
(equivalent to a matmul of the concatenation) so every weight has clean axis names.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import ModelDef, layernorm, mse, normal, ones, randint, weight, zeros


@dataclass(frozen=True)
class GNSConfig:
    nodes: int = 64
    edges: int = 256
    node_feat: int = 8
    edge_feat: int = 4
    hidden: int = 32        # latent size of nodes and edges
    mlp_width: int = 32     # hidden width inside every MLP ("ffn" axis)
    steps: int = 2          # message-passing steps
    out_feat: int = 2
    lr: float = 3e-3


# Retune here.
PRESETS = {
    "tiny": GNSConfig(),
    "full": GNSConfig(nodes=800_000, edges=8_000_000, node_feat=30, edge_feat=3, hidden=128,
                      mlp_width=128, steps=10, out_feat=3, lr=1e-4),
}


def mlp_spec(inputs: dict[str, tuple[str, int]], width: int, out: tuple[str, int],
             norm: bool) -> dict:
    fan_in = sum(size for _, size in inputs.values())
    out_name, out_size = out
    s = {
        "w_in": {k: weight((size, width), (name, "ffn"), fan_in=fan_in)
                 for k, (name, size) in inputs.items()},
        "b_in": zeros((width,), ("ffn",)),
        "w_out": weight((width, out_size), ("ffn", out_name)),
        "b_out": zeros((out_size,), (out_name,)),
    }
    if norm:
        s["ln"] = {"scale": ones((out_size,), (out_name,)), "bias": zeros((out_size,), (out_name,))}
    return s


def spec(c: GNSConfig):
    lat = ("hidden", c.hidden)
    w = c.mlp_width
    params = {
        "encoder": {
            "node": mlp_spec({"x": ("features", c.node_feat)}, w, lat, norm=True),
            "edge": mlp_spec({"e": ("features", c.edge_feat)}, w, lat, norm=True),
        },
        "processor": [
            {"edge": mlp_spec({"edge": lat, "sender": lat, "receiver": lat}, w, lat, norm=True),
             "node": mlp_spec({"node": lat, "agg": lat}, w, lat, norm=True)}
            for _ in range(c.steps)
        ],
        "decoder": mlp_spec({"x": lat}, w, ("out_features", c.out_feat), norm=False),
    }
    batch = {
        "nodes": normal((c.nodes, c.node_feat), ("nodes", "features")),
        "edges": normal((c.edges, c.edge_feat), ("edges", "features")),
        "senders": randint((c.edges,), ("edges",), c.nodes),
        "receivers": randint((c.edges,), ("edges",), c.nodes),
        "targets": normal((c.nodes, c.out_feat), ("nodes", "out_features")),
    }
    return params, batch


def mlp(p, **inputs):
    h = sum(jnp.dot(inputs[k], p["w_in"][k]) for k in sorted(inputs)) + p["b_in"]
    out = jnp.dot(jax.nn.relu(h), p["w_out"]) + p["b_out"]
    if "ln" in p:
        out = layernorm(out, p["ln"]["scale"], p["ln"]["bias"])
    return out


def loss(c: GNSConfig, params, batch):
    senders, receivers = batch["senders"], batch["receivers"]
    x = mlp(params["encoder"]["node"], x=batch["nodes"])
    e = mlp(params["encoder"]["edge"], e=batch["edges"])
    for p in params["processor"]:
        e = e + mlp(p["edge"], edge=e, sender=x[senders], receiver=x[receivers])
        agg = jax.ops.segment_sum(e, receivers, num_segments=c.nodes)
        x = x + mlp(p["node"], node=x, agg=agg)
    return mse(mlp(params["decoder"], x=x), batch["targets"])


GNS = ModelDef(
    name="gns",
    description="GNS-style graph network: MLP encoders, gather + segment_sum message passing",
    config_cls=GNSConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
)
