"""The multi-process flags of the argparse commands (``embedding-jax encode``, ``search``),
without importing JAX (``--help`` stays fast)."""

from __future__ import annotations

import argparse


def add_coordinator_arguments(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--coordinator_address``, ``--num_processes``, ``--process_id`` (``what``: what each
    process does, appended to the help) for :func:`initialize_from_arguments`."""
    parser.add_argument("--coordinator_address", default=None,
                        help="multi-process runs: host:port of process 0, or 'auto' on a TPU "
                             "pod (also $JAX_COORDINATOR_ADDRESS); every process runs the same "
                             f"command{what}")
    parser.add_argument("--num_processes", type=int, default=None, help="with a host:port")
    parser.add_argument("--process_id", type=int, default=None, help="with a host:port")


def initialize_from_arguments(args: argparse.Namespace) -> None:
    """``parallel.maybe_initialize_distributed`` of those flags' values."""
    from embedding_core.distributed import parallel

    parallel.maybe_initialize_distributed(args.coordinator_address, args.num_processes,
                                          args.process_id)
