"""KALM's stages per benchmark: each benchmark's offline runs, evaluation and report table stand apart, and the
lists that say which benchmarks run agree."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmrl.config.profiles import KalmParams
from llmrl.files import write_json
from llmrl.report.collect import MissingResultError, kalm_eval_table


def test_a_grounded_benchmark_without_a_learner_is_refused_naming_both_lists():
    with pytest.raises(ValidationError, match=r"kalm\.offline\.algos train on \['babyai', 'metaworld'\] but "
                                              r"kalm\.ground\.benchmarks is \['babyai'\]"):
        KalmParams(ground={"benchmarks": ["babyai"]})


def test_a_learner_benchmark_without_recorded_data_is_refused():
    with pytest.raises(ValidationError, match=r"kalm\.data\.benchmarks lacks \['metaworld'\]"):
        KalmParams(data={"benchmarks": ["babyai"]})


def test_the_default_lists_agree():
    KalmParams()


def test_an_offline_stage_refuses_an_algorithm_of_another_benchmark():
    from stages import kalm_offline_real

    with pytest.raises(SystemExit, match=r"babyai-dbc.* trains on babyai, not 'metaworld'"):
        kalm_offline_real.main(["metaworld", "babyai-dbc"])
    with pytest.raises(SystemExit, match=r"'no-such-run' is not in kalm\.offline\.algos"):
        kalm_offline_real.main(["babyai", "no-such-run"])


def test_an_evaluation_of_a_benchmark_without_learners_is_refused():
    from stages import kalm_eval

    with pytest.raises(SystemExit, match=r"benchmark 'clevr' has no run in kalm\.offline\.algos"):
        kalm_eval.main(["clevr"])


def _table(root, folder, benchmark, levels, rows):
    write_json(root / "metrics/kalm/eval" / folder / "table.json",
               {"benchmark": benchmark, "levels": levels,
                "rows": [{"benchmark": benchmark, "row": r, "level": lv} for r in rows for lv in levels]})


def test_the_report_merges_each_benchmarks_table(tmp_path):
    _table(tmp_path, "babyai", "babyai", ["rephrase", "easy"], ["random", "babyai-dbc-real"])
    _table(tmp_path, "metaworld", "metaworld", ["rephrase", "hard"], ["random"])
    table = kalm_eval_table(tmp_path)
    assert table["levels"] == ["rephrase", "easy", "hard"]
    assert [(r["benchmark"], r["row"], r["level"]) for r in table["rows"]][:2] == [
        ("babyai", "random", "rephrase"), ("babyai", "random", "easy")]
    assert len(table["rows"]) == 6


def test_a_table_in_another_benchmarks_folder_is_an_error_naming_it(tmp_path):
    _table(tmp_path, "babyai", "metaworld", ["easy"], ["random"])
    with pytest.raises(MissingResultError, match=r"metrics/kalm/eval/babyai/table\.json: holds benchmark "
                                                 r"'metaworld', not 'babyai'"):
        kalm_eval_table(tmp_path)


def test_no_evaluation_at_all_is_a_missing_result(tmp_path):
    (tmp_path / "metrics/kalm/eval").mkdir(parents=True)
    with pytest.raises(MissingResultError, match="metrics/kalm/eval"):
        kalm_eval_table(tmp_path)


@pytest.mark.parametrize("pipeline", ["", "study/dvc.yaml:"])
@pytest.mark.parametrize("benchmark,other", [("babyai", "metaworld"), ("metaworld", "babyai")])
def test_a_benchmarks_evaluation_needs_none_of_the_other_benchmarks_stages(pipeline, benchmark, other):
    """So the study runs one benchmark end to end while the other's grounding is stale or absent."""
    from pathlib import Path

    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(Path(__file__).resolve().parents[1])) as repo:
        graph = repo.index.graph
        node = next(s for s in graph.nodes if s.addressing == f"{pipeline}kalm_eval@{benchmark}")
        upstream = [s.addressing.removeprefix(pipeline) for s in nx.descendants(graph, node)]
    kalm = [u for u in upstream if u.startswith("kalm_")]
    assert {u.split("@")[0] for u in kalm} == {"kalm_data", "kalm_ground", "kalm_imagine", "kalm_offline_real",
                                               "kalm_offline_imagine"}
    assert [u for u in kalm if other in u] == []
