"""One process of ``test_first_step_barrier.py``: ``dualcse-jax train`` with this command
line, whose first step comes ``DELAY_ENV`` seconds late (a host that compiles later than its
peers): the first ``parallel.host_to_global``, the loop's last call before that step, sleeps
first and prints ``DELAYED`` when it starts."""

import os
import sys
import time

DELAY_ENV = "EMBEDDING_JAX_TEST_FIRST_STEP_DELAY_S"
DELAYED = "first step delayed by"


def main() -> None:
    from dualcse_jax import main as cli
    from embedding_core.distributed import parallel

    delay = float(os.environ.get(DELAY_ENV, "0"))
    if delay > 0:
        plain, calls = parallel.host_to_global, []

        def late(*args, **kwargs):
            if not calls:
                calls.append(delay)
                print(f"{DELAYED} {delay:g} s", flush=True)
                time.sleep(delay)
            return plain(*args, **kwargs)

        parallel.host_to_global = late
    sys.argv = ["dualcse-jax", *sys.argv[1:]]
    cli.run()


if __name__ == "__main__":
    main()
