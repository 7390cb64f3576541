"""One process of a two-process JAX job (tests/test_cluster.py starts two): 4 CPU devices
each, gloo collectives, the coordinator on a loopback port. It applies a plan file to the
tiny demo transformer (or the spec's "model": [name, overrides]) and trains a few steps
from the demo's seed, printing one JSON line: the losses, the mesh's device layout (process
of each device) and what a host value gave.

    python tests/_two_process.py '{"process_id": 0, "port": 12345, "plan": "plan.json", "steps": 3}'
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def local_rows(sharding, shape) -> slice:
    """The rows of a leading-dim-sharded array this process's devices hold (one block: the
    mesh keeps a process's devices together)."""
    rows = [i[0] if i else slice(None) for i in sharding.addressable_devices_indices_map(shape).values()]
    start = min(r.start or 0 for r in rows)
    stop = max(shape[0] if r.stop is None else r.stop for r in rows)
    return slice(start, stop)


def main(spec: dict) -> dict:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_compilation_cache_dir", os.path.join(ROOT, ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{spec['port']}", num_processes=2,
                               process_id=spec["process_id"], initialization_timeout=120)
    import numpy as np

    import demo_models
    import partex

    name, overrides = spec.get("model", ("transformer", {}))
    model = demo_models.build(name, "tiny", overrides)
    plan = partex.Plan.load(spec["plan"])
    out = {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
           "local_devices": jax.local_device_count()}
    mesh = plan.jax_mesh()
    out["layout"] = [[d.process_index for d in row] for row in mesh.devices.reshape(mesh.devices.shape[0], -1)]
    out["axes"] = list(mesh.axis_names)
    out["grid"] = mesh.devices.shape
    step = partex.apply_plan(plan, model.fn, mesh=mesh)
    params, opt_state, batch = partex.shard_inputs(plan, model.args, mesh)
    # a batch each process loads for itself: the rows its devices hold, made global by JAX
    shardings = partex.plan_shardings(plan, model.args, mesh)[2]
    loaded = jax.tree_util.tree_map(
        lambda sh, full: jax.make_array_from_process_local_data(sh, np.asarray(full)[local_rows(sh, full.shape)],
                                                                full.shape),
        shardings, model.args[2])
    out["local_batch_equal"] = all(
        np.array_equal(a.data, b.data) and a.index == b.index
        for x, y in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(batch))
        for a, b in zip(sorted(x.addressable_shards, key=lambda s: s.device.id),
                        sorted(y.addressable_shards, key=lambda s: s.device.id)))
    batch = loaded
    losses = []
    for _ in range(spec["steps"]):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))  # replicated: every process reads it
    try:
        step(*model.args)  # this process's own values: a clear error, nothing runs
    except partex.PartexError as e:
        out["host_value_error"] = str(e)
    out["losses"] = losses
    return out


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    try:
        result = {"ok": main(spec)}
        code = 0
    except Exception as e:  # PartexError: bad input, one line; anything else keeps its traceback
        import traceback

        from partex import PartexError

        result = {"error": str(e)} if isinstance(e, PartexError) else {"crash": traceback.format_exc()}
        code = 2 if isinstance(e, PartexError) else 1
    print(json.dumps({"partex-two-process": result}), flush=True)
    sys.exit(code)
