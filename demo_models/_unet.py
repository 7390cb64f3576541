"""U-Net denoiser (diffusion-style): conv down/up blocks, skip concats, attention at the bottleneck.

NHWC activations, HWIO kernels, `lax.conv_general_dilated` for every conv; downsampling
by a stride-2 conv, upsampling by nearest neighbour (broadcast + reshape); GroupNorm +
SiLU residual blocks; multi-head self-attention over the flattened height*width at the
bottleneck.  Loss: MSE between predicted and true noise of x_t = sqrt(a) x + sqrt(1-a) eps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ._common import ModelDef, check_divides, mse, normal, ones, weight, zeros

ALPHA = 0.5  # fixed noise level of the denoising objective


@dataclass(frozen=True)
class UNetConfig:
    image: int = 16          # height = width
    in_channels: int = 3
    base_channels: int = 8
    levels: int = 2          # number of stride-2 downsamplings
    max_mult: int = 4        # channels at level i = base * min(2**i, max_mult)
    groups: int = 4          # GroupNorm groups
    heads: int = 2           # bottleneck attention heads
    batch: int = 8
    lr: float = 3e-3

    def channels(self, level: int) -> int:
        return self.base_channels * min(2**level, self.max_mult)


# Retune here.
PRESETS = {
    "tiny": UNetConfig(),
    "full": UNetConfig(image=256, in_channels=3, base_channels=128, levels=4, max_mult=4,
                       groups=32, heads=8, batch=144, lr=1e-4),
}


def validate(c: UNetConfig) -> None:
    check_divides("unet", "image must be divisible by 2**levels", 2**c.levels, c.image)
    for i in range(c.levels):
        check_divides("unet", f"channels at level {i} must be divisible by groups",
                      c.groups, c.channels(i))
    check_divides("unet", "bottleneck channels must be divisible by heads",
                  c.heads, c.channels(c.levels - 1))


# --------------------------------------------------------------------------- specs

KERNEL = (None, None, "in_channels", "channels")


def conv_spec(k: int, cin: int, cout: int) -> dict:
    return {"w": weight((k, k, cin, cout), KERNEL, fan_in=k * k * cin),
            "b": zeros((cout,), ("channels",))}


def norm_spec(ch: int) -> dict:
    return {"scale": ones((ch,), ("channels",)), "bias": zeros((ch,), ("channels",))}


def block_spec(cin: int, cout: int) -> dict:
    s = {"norm1": norm_spec(cin), "conv1": conv_spec(3, cin, cout),
         "norm2": norm_spec(cout), "conv2": conv_spec(3, cout, cout)}
    if cin != cout:
        s["skip"] = conv_spec(1, cin, cout)
    return s


def attn_spec(ch: int, heads: int) -> dict:
    hd = ch // heads
    names = ("channels", "heads", "head_dim")
    return {"norm": norm_spec(ch),
            "wq": weight((ch, heads, hd), names), "wk": weight((ch, heads, hd), names),
            "wv": weight((ch, heads, hd), names),
            "wo": weight((heads, hd, ch), ("heads", "head_dim", "channels"), fan_in=ch)}


def spec(c: UNetConfig):
    chans = [c.channels(i) for i in range(c.levels)]
    down, prev = [], chans[0]
    for ch in chans:
        down.append({"block": block_spec(prev, ch), "downsample": conv_spec(3, ch, ch)})
        prev = ch
    mid_ch = chans[-1]
    up, prev = [], mid_ch
    for ch in reversed(chans):
        up.append({"block": block_spec(prev + ch, ch)})
        prev = ch
    params = {
        "stem": conv_spec(3, c.in_channels, chans[0]),
        "down": down,
        "mid": {"block1": block_spec(mid_ch, mid_ch), "attn": attn_spec(mid_ch, c.heads),
                "block2": block_spec(mid_ch, mid_ch)},
        "up": up,
        "out": {"norm": norm_spec(chans[0]), "conv": conv_spec(1, chans[0], c.in_channels)},
    }
    img = (c.batch, c.image, c.image, c.in_channels)
    names = ("batch", "height", "width", "channels")
    return params, {"x": normal(img, names), "noise": normal(img, names)}


# --------------------------------------------------------------------------- math


def conv(p, x, stride: int = 1):
    y = jax.lax.conv_general_dilated(
        x, p["w"], window_strides=(stride, stride), padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["b"]


def group_norm(p, x, groups: int, eps: float = 1e-5):
    b, h, w, ch = x.shape
    g = x.reshape(b, h, w, groups, ch // groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + eps)
    return g.reshape(b, h, w, ch) * p["scale"] + p["bias"]


def res_block(c: UNetConfig, p, x):
    h = conv(p["conv1"], jax.nn.silu(group_norm(p["norm1"], x, _groups(c, x))))
    h = conv(p["conv2"], jax.nn.silu(group_norm(p["norm2"], h, _groups(c, h))))
    skip = conv(p["skip"], x) if "skip" in p else x
    return skip + h


def _groups(c: UNetConfig, x) -> int:
    # Concatenated skip inputs have channels that are sums of level channels; use the
    # largest group count <= c.groups that divides them.
    ch = x.shape[-1]
    return math.gcd(ch, c.groups)


def upsample(x):
    b, h, w, ch = x.shape
    x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, ch))
    return x.reshape(b, 2 * h, 2 * w, ch)


def self_attention(c: UNetConfig, p, x):
    b, h, w, ch = x.shape
    y = group_norm(p["norm"], x, _groups(c, x)).reshape(b, h * w, ch)
    q = jnp.einsum("btc,chd->bthd", y, p["wq"])
    k = jnp.einsum("bsc,chd->bshd", y, p["wk"])
    v = jnp.einsum("bsc,chd->bshd", y, p["wv"])
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    out = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("bthd,hdc->btc", out, p["wo"])
    return x + out.reshape(b, h, w, ch)


def unet(c: UNetConfig, params, x):
    x = conv(params["stem"], x)
    skips = []
    for p in params["down"]:
        x = res_block(c, p["block"], x)
        skips.append(x)
        x = conv(p["downsample"], x, stride=2)
    mid = params["mid"]
    x = res_block(c, mid["block1"], x)
    x = self_attention(c, mid["attn"], x)
    x = res_block(c, mid["block2"], x)
    for p, skip in zip(params["up"], reversed(skips)):
        x = jnp.concatenate([upsample(x), skip], axis=-1)
        x = res_block(c, p["block"], x)
    out = params["out"]
    x = jax.nn.silu(group_norm(out["norm"], x, _groups(c, x)))
    return conv(out["conv"], x)


def loss(c: UNetConfig, params, batch):
    noisy = math.sqrt(ALPHA) * batch["x"] + math.sqrt(1.0 - ALPHA) * batch["noise"]
    return mse(unet(c, params, noisy), batch["noise"])


UNET = ModelDef(
    name="unet",
    description="U-Net denoiser: conv down/up blocks, skip concats, bottleneck attention",
    config_cls=UNetConfig,
    presets=PRESETS,
    spec=spec,
    loss=loss,
    validate=validate,
)
