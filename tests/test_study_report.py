"""The study page's rliable summaries (llmrl/report/study.py): rows and claims read from each method's result files,
a claim only where the probability-of-improvement interval excludes 0.5, and KALM's claims gated on its imagination."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmrl.files import write_json
from llmrl.report.collect import MissingResultError
from llmrl.report.study import (kalm_comparisons, llm_rl_rows, poi_reading, props_comparisons, props_rows,
                                summary_section)


def _final(per_seed):
    return {"final": {"value": float(np.mean(per_seed)), "ci_low": min(per_seed), "ci_high": max(per_seed),
                      "per_seed": per_seed, "n_seeds": len(per_seed), "episodes": 20 * len(per_seed)}}


def _props_tree(root: Path) -> None:
    write_json(root / "plots/props/report.json", {
        "tasks": {"pendulum": {"props": _final([-900.0, -950.0, -1000.0, -920.0, -980.0]),
                               "random_search": _final([-200.0, -250.0, -180.0, -220.0, -240.0])}},
        "quadratic": {"table": {"props": _final([99.0, 98.0, 97.0, 99.5, 98.5]),
                                "random_search": _final([90.0, 91.0, 92.0, 89.0, 90.5])}}})


def _llm_rl_tree(root: Path) -> None:
    write_json(root / "metrics/llm_rl/responses/base.json", {"greedy": {"per_seed": [0.2]},
                                                             "sampled": {"per_seed": [0.21]}})
    write_json(root / "metrics/llm_rl/responses/grpo.json", {"greedy": {"per_seed": [0.2, 0.22, 0.19]},
                                                             "sampled": {"per_seed": [0.2, 0.25, 0.18]}})


def _kalm_tree(root: Path, imagines: bool) -> None:
    rows = []
    for row, base in (("DiscreteBC-real", 0.5), ("DiscreteBC-imagine", 0.6), ("random", 0.2)):
        for level in ("rephrase", "easy"):
            rows.append({"benchmark": "babyai", "row": row, "level": level,
                         "per_seed": [base, base + 0.01, base - 0.01]})
    write_json(root / "metrics/kalm/eval/babyai/table.json", {"benchmark": "babyai", "levels": ["rephrase", "easy"],
                                                             "rows": rows})
    write_json(root / "metrics/kalm/imagine_babyai_train.json", {
        "imagines": imagines, "replay_success": 0.5 if imagines else 0.0, "replay_success_ci": [0.3, 0.7],
        "random_replay_success": 0.05, "random_replay_success_ci": [0.0, 0.1]})


def test_props_rows_keep_tasks_apart_and_compare_with_random_search(tmp_path):
    _props_tree(tmp_path)
    rows = props_rows(tmp_path)
    assert rows[("pendulum", "props")].shape == (5, 1) and ("quadratic", "random_search") in rows
    claims = {c.group: c for c in props_comparisons(tmp_path)}
    assert set(claims) == {"pendulum", "quadratic"}
    sec = summary_section("props", tmp_path, tmp_path, reps=200)
    readings = {r[0]: r[-1] for r in sec.tables[1].rows}
    assert readings == {"pendulum": "worse", "quadratic": "improves"}


def test_llm_rl_rows_compare_each_variant_with_the_base_model_per_mode(tmp_path):
    _llm_rl_tree(tmp_path)
    assert llm_rl_rows(tmp_path)[("greedy", "grpo")].ravel().tolist() == [0.2, 0.22, 0.19]
    sec = summary_section("llm_rl", tmp_path, tmp_path, reps=200)
    assert {(r[0], r[1], r[2]) for r in sec.tables[1].rows} == {("greedy", "grpo", "base"),
                                                                 ("sampled", "grpo", "base")}


@pytest.mark.parametrize("imagines", [True, False])
def test_kalm_claims_about_imagined_data_need_the_imagination_to_work(tmp_path, imagines):
    _kalm_tree(tmp_path, imagines)
    claim = next(c for c in kalm_comparisons(tmp_path) if c.row == "DiscreteBC-imagine")
    assert (claim.gate is None) == imagines
    sec = summary_section("kalm", tmp_path, tmp_path, reps=200)
    reading = next(r[-1] for r in sec.tables[1].rows if r[1] == "DiscreteBC-imagine")
    assert reading == ("improves" if imagines else claim.gate)
    assert reading.startswith("improves") or "the imagination failed" in reading


def test_a_missing_result_names_its_file(tmp_path):
    with pytest.raises(MissingResultError, match="plots/props/report.json"):
        props_rows(tmp_path)
    with pytest.raises(MissingResultError, match="metrics/llm_rl/responses"):
        llm_rl_rows(tmp_path)


def test_poi_reading_only_claims_where_the_interval_excludes_a_half():
    assert poi_reading({"ci_low": 0.55, "ci_high": 0.9}) == "improves"
    assert poi_reading({"ci_low": 0.1, "ci_high": 0.45}) == "worse"
    assert poi_reading({"ci_low": 0.4, "ci_high": 0.8}) == "no difference shown"
