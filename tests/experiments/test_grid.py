"""The experiment grid: finished cells are skipped, tables pair items and average seeds."""

import json

import numpy as np
import pytest

from experiments import grid


def test_finished_cells_are_skipped_and_unfinished_ones_run(tmp_path):
    calls = []

    def make(value):
        def run(workdir):
            calls.append(workdir.name)
            return {"acc": np.array([value, 1.0])}
        return run

    specs = [grid.RunSpec("A", "a-s0", make(0.0), seed=0),
             grid.RunSpec("A", "a-s1", make(1.0), seed=1),
             grid.RunSpec("B", "b", make(0.5))]
    first = grid.run_grid(specs[:2], tmp_path)
    assert calls == ["a-s0", "a-s1"]
    out = grid.run_grid(specs, tmp_path)
    assert calls == ["a-s0", "a-s1", "b"]  # the two finished cells were not re-run
    assert [s for s, _ in out["A"]] == [0, 1]
    np.testing.assert_array_equal(out["A"][1][1]["acc"], first["A"][1][1]["acc"])
    assert not list(tmp_path.rglob("*.tmp"))


def test_only_selects_cells_but_collects_finished_ones(tmp_path):
    specs = [grid.RunSpec("A", "a", lambda w: {"m": np.ones(2)}),
             grid.RunSpec("B", "b", lambda w: {"m": np.zeros(2)})]
    grid.run_grid(specs[:1], tmp_path)
    out = grid.run_grid(specs, tmp_path, only=["zzz"])
    assert list(out) == ["A"]


def test_table_only_runs_nothing_and_collects_finished_cells(tmp_path):
    ran = []
    specs = [grid.RunSpec("A", "a", lambda w: ran.append("a") or {"m": np.ones(2)}),
             grid.RunSpec("B", "b", lambda w: ran.append("b") or {"m": np.zeros(2)})]
    grid.run_grid(specs[:1], tmp_path)
    out = grid.run_grid(specs, tmp_path, table_only=True)
    assert ran == ["a"] and list(out) == ["A"] and not (tmp_path / "b").exists()


def test_duplicate_keys_are_refused(tmp_path):
    spec = grid.RunSpec("A", "a", lambda w: {})
    with pytest.raises(ValueError, match="repeated"):
        grid.run_grid([spec, spec], tmp_path)


def test_macro_average_items_mean_is_the_average_of_set_means():
    a, b = np.array([1.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0])  # means 0.25 and 1.0
    items = grid.macro_average_items([a, b])
    assert items.mean() == pytest.approx(0.625)
    assert items.size == 6


def test_table_averages_seeds_and_pairs_the_reference():
    ref = [(None, {"acc": np.array([0.0, 0.0, 1.0, 1.0])})]
    sys_runs = [(0, {"acc": np.array([1.0, 0.0, 1.0, 1.0])}),   # 75 %
                (1, {"acc": np.array([1.0, 1.0, 1.0, 1.0])})]   # 100 %
    text = grid.results_table({"base": ref, "trained": sys_runs}, ["acc"],
                              reference="base", primary="acc", num_samples=2000)
    row = next(line for line in text.splitlines() if line.startswith("| trained"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2"
    assert cells[2] == "87.50"                       # mean over seeds and items
    assert cells[3] == f"{np.std([75.0, 100.0], ddof=1):.2f}"
    # seed-averaged per-item differences are [1, .5, 0, 0]: mean 0.375
    assert cells[4].startswith("+37.50 [")
    low, high = (float(x) for x in cells[4].split("[")[1].rstrip("]").split(","))
    assert 0.0 <= low < 37.5 < high <= 100.0


def test_unpaired_item_counts_are_refused():
    with pytest.raises(ValueError, match="not paired"):
        grid.results_table({"a": [(None, {"m": np.ones(3)})], "b": [(0, {"m": np.ones(4)})]},
                           ["m"], reference="a", primary="m")


@pytest.mark.parametrize("value", ["0", "-5", "ten"])
def test_num_samples_below_one_is_refused_by_the_parser(value, capsys):
    with pytest.raises(SystemExit):
        grid.parser("demo", "d").parse_args(["--num-samples", value])
    assert "--num-samples" in capsys.readouterr().err


def test_num_samples_accepts_a_positive_count():
    assert grid.parser("demo", "d").parse_args(["--num-samples", "7"]).num_samples == 7


def test_results_end_with_each_cells_commit_and_older_cells_say_not_recorded(tmp_path):
    specs = [grid.RunSpec("A", "a", lambda w: {"m": np.ones(2)}),
             grid.RunSpec("B", "b", lambda w: {"m": np.zeros(2)}),
             grid.RunSpec("C", "c", lambda w: {"m": np.zeros(2)})]
    results = grid.run_grid(specs[:2], tmp_path / "cells")
    (tmp_path / "cells" / "b" / grid.CELL_FILE).unlink()  # as a cell of an older grid
    md = grid.write_results("demo", "# t", results, tmp_path / "out", specs=specs,
                            root=tmp_path / "cells").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| a |")
            or line.startswith("| b |") or line.startswith("| c |")]
    assert len(rows) == 3
    assert f"`{grid.commit()}`" in rows[0] and "UTC" in rows[0]
    assert rows[1] == "| b | not recorded | — | — |"
    assert rows[2].startswith("| c | not finished yet")  # c never ran: listed as missing


def test_cells_filled_in_afterwards_carry_a_footnote(tmp_path):
    specs = [grid.RunSpec("A", k, lambda w: {"m": np.ones(2)}) for k in ("a", "b", "c")]
    results = grid.run_grid(specs, tmp_path / "cells")
    for key, source in (("a", "from log X"), ("c", "from log Y")):
        (tmp_path / "cells" / key / grid.CELL_FILE).write_text(json.dumps(
            {"commit": "abc1234", "seconds": 60, "finished": "then", "source": source}))
    md = grid.write_results("demo", "# t", results, tmp_path / "out", specs=specs,
                            root=tmp_path / "cells").read_text()
    assert "| a | `abc1234`* | then | 1.0 min |" in md
    assert "| c | `abc1234`** | then | 1.0 min |" in md
    assert md.rstrip().endswith("* from log X\n** from log Y")
