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
    specs = [grid.RunSpec(k.upper(), k, lambda w: {"m": np.ones(2)}) for k in "abc"]
    grid.run_grid(specs[:1], tmp_path)
    out = grid.run_grid(specs, tmp_path, only=["c"])
    assert list(out) == ["A", "C"] and not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="--only 'zzz' matches no cell"):
        grid.run_grid(specs, tmp_path, only=["zzz"])


def test_bad_cells_are_one_error_naming_the_file_and_optional_keys_are_dropped(tmp_path,
                                                                              capsys):
    specs = [grid.RunSpec("A", f"a{s}", None, seed=s) for s in range(3)]
    grid.save_scores(tmp_path / "a0" / grid.SCORES_FILE, {"m": np.ones(4), "sims": np.ones(4)})
    grid.save_scores(tmp_path / "a1" / grid.SCORES_FILE, {"m": np.zeros(4)})
    (tmp_path / "a2").mkdir()
    (tmp_path / "a2" / grid.SCORES_FILE).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"a2/scores.npz: not a readable scores file .*"
                                         r"delete .*a2 to run that cell again"):
        grid.run_grid(specs, tmp_path, table_only=True)
    with pytest.raises(ValueError, match="cell a1 of 'A' lacks 1 score"):
        grid.run_grid(specs[:2], tmp_path, table_only=True)  # "sims" is not optional
    out = grid.run_grid(specs[:2], tmp_path, table_only=True, optional=lambda k: k == "sims")
    assert [sorted(sc) for _, sc in out["A"]] == [["m"], ["m"]]
    assert "A: cell(s) a1 kept no 'sims' and 0 more" in capsys.readouterr().out
    grid.save_scores(tmp_path / "a1" / grid.SCORES_FILE, {"m": np.zeros(5)})
    with pytest.raises(ValueError, match="'m' has different lengths across cells"):
        grid.run_grid(specs[:2], tmp_path, table_only=True, optional=lambda k: k == "sims")
    with pytest.raises(ValueError, match="is not a folder"):
        grid.run_grid(specs, tmp_path / "absent", table_only=True)


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


def test_a_results_pair_is_written_whole_or_not_at_all(tmp_path):
    results = {"A": [(None, {"m": np.ones(2)})]}
    out = tmp_path / "out"
    grid.write_results("demo", "# old", results, out)
    before = (out / "demo.npz").read_bytes()
    (out / "demo.md").unlink()
    (out / "demo.md").mkdir()  # the Markdown cannot be replaced
    with pytest.raises(IsADirectoryError, match="not written"):
        grid.write_results("demo", "# new", {"A": [(None, {"m": np.zeros(2)})]}, out)
    assert (out / "demo.npz").read_bytes() == before and sorted(
        p.name for p in out.iterdir()) == ["demo.md", "demo.npz"]


def test_cli_errors_are_one_line(tmp_path, cli):
    for args, message in ((["--only", "zzz"], "--only 'zzz' matches no cell of this grid"),
                          (["--table-only", "--root", str(tmp_path / "none")],
                           f"--root {tmp_path / 'none'} is not a folder")):
        run = cli("experiments.docent", *args, "--results", str(tmp_path / "out"),
                  env={"EMBEDDING_JAX_DEBUG": ""})
        assert run.returncode == 1 and run.stderr.splitlines()[0] == (
            f"python -m experiments.docent grid: error: {message} (--list prints them)"
            if "only" in message else
            f"python -m experiments.docent grid: error: {message}: no cell to table (run "
            "without --table-only to start the grid)"), run.stderr
    assert not (tmp_path / "out").exists()


def test_cells_filled_in_afterwards_carry_a_footnote(tmp_path):
    specs = [grid.RunSpec("A", k, lambda w: {"m": np.ones(2)}) for k in ("a", "b", "c")]
    results = grid.run_grid(specs, tmp_path / "cells")
    for key, source in (("a", "from log X"), ("c", "from log Y")):
        (tmp_path / "cells" / key / grid.CELL_FILE).write_text(json.dumps(
            {"commit": "abc1234", "seconds": 60, "finished": "then", "source": source}))
    md = grid.write_results("demo", "# t\n\n* a bullet, not a footnote", results,
                            tmp_path / "out", specs=specs, root=tmp_path / "cells").read_text()
    assert "| a | `abc1234`* | then | 1.0 min |" in md
    assert "| c | `abc1234`** | then | 1.0 min |" in md
    assert md.rstrip().endswith("* from log X\n** from log Y")
    with open(tmp_path / "out" / "demo.md", "a") as f:
        f.write("\n* a bullet after the footnotes\n")
    cells = grid._cells_in_markdown(tmp_path / "out" / "demo.md")  # as restore_cells reads it
    assert (cells["a"]["source"], cells["c"]["source"]) == ("from log X", "from log Y")
    (tmp_path / "out" / "demo.md").write_text(md.replace("1.0 min |", "abc min |", 1))
    with pytest.raises(ValueError, match=r"demo.md:\d+: Cells row 'a' has wall time 'abc min'"):
        grid._cells_in_markdown(tmp_path / "out" / "demo.md")
