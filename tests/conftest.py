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
# the suite runs on one pytest-xdist worker per core: its searches score their plans in their
# own process (tests/test_scorers.py forks scoring processes on purpose)
os.environ.setdefault("PARTEX_PROCESSES", "1")


def pytest_addoption(parser):
    parser.addoption("--hypothesis-large", action="store_true", default=False,
                     help="property tests (tests/test_properties.py): 10x the generated programs")


def pytest_configure(config):
    # read by tests/test_properties.py at import (after configure, before collection)
    if config.getoption("--hypothesis-large", default=False):
        os.environ["PARTEX_HYPOTHESIS_LARGE"] = "1"
