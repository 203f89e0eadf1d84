"""One process of ``test_export_parts.py``: ``serving.export`` of a synthetic model.

argv: spec.json — {"coordinator", "num_processes", "process_id", "rows", "input",
"bad_input", "out", "report"}. :func:`run` (also called in the test's own process for the
one-process reference) writes ``out/ok`` twice (table and text views), then tries
``out/bad`` (a text whose vector is NaN, in process 1's rows) and reports the error.
"""

import hashlib
import json
import sys

import numpy as np


def table_rows(index: np.ndarray, dim: int) -> np.ndarray:
    """Row ``i`` of the synthetic table: a function of ``i`` alone, float32 ``[n, dim]``."""
    return np.sin(index[:, None] * 0.37 + np.arange(dim)[None, :] * 1.3).astype(np.float32)


class Synthetic:
    """The ``serving.export`` side of an ``Encoder``: a ``table`` view of ``rows`` rows and
    a ``texts`` view (bytes of each text's SHA-256; ``"NaN"`` gives NaN)."""

    name, step, default_normalize = "synthetic", 3, False

    def __init__(self, rows: int, dim: int = 8, block: int = 4):
        import ml_collections

        from embedding_core.serving.serving import View

        self.rows, self.dim, self.block = rows, dim, block
        self.config = ml_collections.ConfigDict({"rows": rows})
        self.views = (View("table", "dot", encode_kwargs=None, table=True),
                      View("texts", "cosine"))

    def export_meta(self) -> dict:
        return {}

    def view_dim(self, name: str) -> int:
        return self.dim

    def table(self, name: str, normalize: bool):
        def blocks():
            for a in range(0, self.rows, self.block):
                index = np.arange(a, min(a + self.block, self.rows))
                yield [f"row{i}" for i in index], table_rows(index, self.dim)

        return self.rows, blocks()

    def encode(self, texts, normalize: bool = False) -> np.ndarray:
        out = np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest()[:self.dim], np.uint8)
                        for t in texts]).astype(np.float32) / 255
        out[[t == "NaN" for t in texts]] = np.nan
        return out


def run(spec: dict) -> dict:
    from embedding_core.serving import serving

    model = Synthetic(spec["rows"])
    for _ in range(2):  # the second export replaces the first's parts
        serving.export(lambda: model, f"{spec['out']}/ok", input_path=spec["input"])
    try:
        serving.export(lambda: model, f"{spec['out']}/bad", input_path=spec["bad_input"])
        error = None
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    return {"error": error}


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    from embedding_core.distributed import parallel

    parallel.maybe_initialize_distributed(spec["coordinator"], spec["num_processes"],
                                          spec["process_id"])
    report = run(spec)
    with open(spec["report"], "w", encoding="utf-8") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
