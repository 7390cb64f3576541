"""Test setup: 8 simulated CPU devices and the persistent compilation cache.

``jax_num_cpu_devices`` must be set before any JAX operation runs, so this happens at
import time, before any test module touches JAX.
"""

import os
import pathlib

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir", str(ROOT / ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
os.environ.setdefault("PARTEX_TEST", "1")
