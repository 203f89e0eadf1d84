"""One process of the 2-process sharded-corpus test: trains DualCSE on a sharded corpus.

argv: overrides_json workdir coordinator num_processes process_id out.npz

Trains ``num_train_steps`` steps through ``dualcse_jax.trainer.train`` with
``config.train_shards`` set, recording the host batches the loop consumed and, while the
batches are being read, the files of the corpus folder this process holds open (from
``/proc/self/fd``). Saves ``step_<s>_<key>`` arrays and ``open_files`` to out.npz.
"""

import json
import os
import sys

import numpy as np


def open_files_under(folder: str) -> list[str]:
    """Names of the files under ``folder`` this process has open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed between listing and reading
        if os.path.dirname(target) == os.path.realpath(folder):
            names.append(os.path.basename(target))
    return sorted(set(names))


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
    from dualcse_jax import trainer
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update(json.loads(overrides))
    config.coordinator_address = coordinator
    config.num_processes = int(nproc)
    config.process_id = int(pid)
    recorded: dict[str, np.ndarray] = {}
    build_task = trainer.build_task

    def recording_task(config, mesh):
        task = build_task(config, mesh)
        make = task.make_batches

        def make_batches(start_step):
            for batch in make(start_step):
                step = int(batch["step"])
                for key, value in batch.items():
                    recorded[f"step_{step}_{key}"] = np.asarray(value)
                if "open_files" not in recorded:
                    recorded["open_files"] = np.array(open_files_under(config.train_shards))
                yield batch

        task.make_batches = make_batches
        return task

    trainer.build_task = recording_task  # train() looks the name up when it runs
    trainer.train(config, workdir)
    import jax

    recorded["process_index"] = np.array(jax.process_index())
    recorded["local_devices"] = np.array(jax.local_device_count())
    np.savez(out, **recorded)


if __name__ == "__main__":
    main()
