"""The tune matrix: cells from axes and names, each cell's config checked whole before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.flows.tune_matrix import CellSpec, TuneMatrix, TuneMatrixError, cell_config, expand, reference_cell

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def local():
    return load_config(ROOT / "configs" / "local.yaml")


def test_axes_make_every_combination_then_the_named_cells():
    ngram = CellSpec(name="ngram", set={"serve.speculative_config": {"method": "ngram"}})
    matrix = TuneMatrix(axes={"serve.max_num_seqs": [2, 4], "serve.enable_prefix_caching": [True, False]},
                        cells=[ngram])  # fmt: skip
    names = [c.name for c in expand(matrix)]
    assert names == ["max_num_seqs=2,enable_prefix_caching=true", "max_num_seqs=2,enable_prefix_caching=false",
                     "max_num_seqs=4,enable_prefix_caching=true", "max_num_seqs=4,enable_prefix_caching=false",
                     "ngram"]  # fmt: skip


def test_the_shipped_local_matrix_gives_three_cells_with_their_settings_and_bench(local):
    matrix = TuneMatrix.model_validate(yaml.safe_load((ROOT / "configs" / "tune-local.yaml").read_text()))
    cells = expand(matrix)
    configs = {c.name: cell_config(local, c, matrix) for c in cells}
    assert [c.serve.max_num_seqs for c in configs.values()] == [2, 4, local.serve.max_num_seqs]
    spec = configs["ngram"].serve.speculative_config
    assert spec is not None and spec["method"] == "ngram"
    assert all(c.bench.max_concurrency == 2 and not c.bench.prefix_hit for c in configs.values())
    # max_num_seqs=4 is the local profile's own setting: the reference cell unless one is named
    assert reference_cell(matrix, cells, local) == "max_num_seqs=4"
    assert local.serve.max_num_seqs == 4 and local.serve.speculative_config is None  # the base is not changed


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"serve.max_num_seq": 3}, "cell c: serve.max_num_seq: there is no such key in the config"),
        ({"bench.num_prompts": 3}, "bench.num_prompts is not a server setting"),
        ({"serve.service_port": 9000}, "serve.service_port is fixed for the whole matrix"),
        ({"serve.max_num_seqs": 0}, "cell c: "),  # the config's own check: ≥ 1
        ({"models.draft.num_speculative_tokens": 3}, "models.draft is not set; set it whole"),
        ({"serve.speculative_config": {"num_speculative_tokens": 3}}, "serve.speculative_config: needs its method"),
        ({"serve.speculative_config": {"method": "ngram", "model": "/x"}}, "names no model"),
    ],
)
def test_a_bad_cell_is_named_with_its_key_before_anything_runs(local, setting, said):
    with pytest.raises(TuneMatrixError, match=None) as caught:
        cell_config(local, CellSpec(name="c", set=setting), TuneMatrix())
    assert said in str(caught.value)


@pytest.mark.parametrize(
    ("matrix", "said"),
    [
        (TuneMatrix(), "the matrix has no cells"),
        (TuneMatrix(cells=[CellSpec(name="a"), CellSpec(name="a")]), "two cells are named 'a'"),
        (TuneMatrix(axes={"serve.max_num_seqs": []}), "axes.serve.max_num_seqs: give at least one value"),
        (TuneMatrix(cells=[CellSpec(name="a")], reference="b"), "reference: no cell is named 'b'"),
        (TuneMatrix(cells=[CellSpec(name="a")], concurrency=[0]), "concurrency: every value must be ≥ 1"),
    ],
)
def test_a_matrix_that_cannot_run_says_why(matrix, said):
    with pytest.raises(TuneMatrixError) as caught:
        expand(matrix)
    assert said in str(caught.value)


def test_a_cell_name_that_would_not_be_a_plain_label_is_refused():
    with pytest.raises(ValueError, match="name"):
        CellSpec(name="a b; rm -rf /", set={})


def test_the_concurrency_list_is_the_bench_and_its_sweep(local):
    cfg = cell_config(local, CellSpec(name="a"), TuneMatrix(concurrency=[1, 4, 8]))
    assert (cfg.bench.max_concurrency, cfg.bench.concurrency_sweep) == (1, [4, 8])
