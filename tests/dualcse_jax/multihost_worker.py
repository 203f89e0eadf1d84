"""One process of the 2-process test: train 3 steps, process 0 saves the parameters.

argv: overrides_json workdir coordinator num_processes process_id out.npz
"""

import json
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils


def _generous_distributed_timeouts() -> None:
    """jax.distributed's start-up and shut-down barriers get 30 min instead of 5: on a
    loaded machine one process may reach them long after the other (a hang guard only)."""
    import functools

    import jax

    jax.distributed.initialize = functools.partial(
        jax.distributed.initialize, initialization_timeout=1800, shutdown_timeout_seconds=1800)


def main() -> None:
    overrides, workdir, coordinator, nproc, pid, out = sys.argv[1:]
    _generous_distributed_timeouts()
    from dualcse_jax.configs import default
    from dualcse_jax.trainer import train

    config = default.get_config()
    config.update(json.loads(overrides))
    config.coordinator_address = coordinator
    config.num_processes = int(nproc)
    config.process_id = int(pid)
    state = train(config, workdir)
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if jax.process_index() == 0:
        flat = {jax.tree_util.keystr(k): np.asarray(v)
                for k, v in jax.tree_util.tree_leaves_with_path(params)}
        np.savez(out, **flat)


if __name__ == "__main__":
    main()
