"""The results page: tables as the metrics hold them, missing files named, switched-off
methods shown as not run, and the page in headless Chromium (no console error, every method's table visible,
a screenshot kept in .cache/test-artifacts/report.png).

The fixture is a small results tree in the real files' shapes (llmrl.eval.headline entries, KALM's table.json,
dvclive .tsv curves, ProPS's best_return.json and an MP4).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from llmrl.config import ParamsError, load_section
from llmrl.config.report import REPORT_SECTIONS, ReportParams
from llmrl.files import write_json
from llmrl.report import MissingResultError, collect_report, write_report

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACT = ROOT / ".cache" / "test-artifacts" / "report.png"
ENV = "AMD EPYC | AVX2 | 1 thread | torch 2.13.0+cpu numpy 2.4.6"


def _mode(success=None, ret=None, *, seeds=1, episodes=100) -> dict:
    """One mode of a headline entry; (value, lo, hi) triples as llmrl.eval.headline writes them."""
    out = {}
    for key, triple in (("success", success), ("return", ret)):
        if triple is not None:
            out.update({key: triple[0], f"{key}_lo": triple[1], f"{key}_hi": triple[2]})
    return {**out, "seeds": seeds, "episodes": episodes}


def _write(root: Path, rel: str, obj) -> None:
    """Metrics as the stages write them (``write_json``: with their checksum); dvclive's plot files as dvclive does."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel.startswith("metrics/") and isinstance(obj, dict):
        write_json(path, obj)
    else:
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) if not isinstance(obj, str) else obj)


def _tsv(name: str, points: list[tuple[int, float]]) -> str:
    return f"step\t{name}\n" + "".join(f"{s}\t{v}\n" for s, v in points)


def _video(path: Path) -> None:
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [np.full((32, 48, 3), 40 * i, np.uint8) for i in range(6)]
    imageio.mimwrite(path, frames, fps=30, codec="libx264", macro_block_size=8)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    m = "metrics"
    # BabyAI baselines
    _write(root, f"{m}/baselines/eval/BabyAI-GoToLocal-v0/bot.json",
           {"env": ENV, "greedy": _mode((1.0, 0.9812, 1.0), (0.9205, 0.9143, 0.9268), episodes=200)})
    _write(root, f"{m}/baselines/eval/BabyAI-GoToLocal-v0/random.json",
           {"env": ENV, "sampled": _mode((0.295, 0.23, 0.3616), (0.1784, 0.1369, 0.2206), episodes=200)})
    # GLAM
    glam = f"{m}/glam/eval/BabyAI-Text-GoToObjS4-v0"
    _write(root, f"{glam}/symbolic_ppo.json", {"env": ENV, "greedy": _mode((1.0, 0.9924, 1.0), (0.8616, 0.8591, 0.8641),
                                                                           seeds=5, episodes=500)})
    _write(root, f"{glam}/glam_lora.json", {"env": ENV, "greedy": _mode((0.0, 0.0, 0.037), (0.0, 0.0, 0.0)),
                                            "sampled": _mode((0.02, 0.0, 0.07), (0.0043, 0.0, 0.0106))})
    for test, success in (("none", (0.11, 0.05, 0.19)), ("french", (0.03, 0.0, 0.0851))):
        _write(root, f"{m}/glam/generalisation/{test}/glam_lora.json",
               {"env": ENV, "greedy": _mode(success, (0.05, 0.02, 0.08))})
    _write(root, "plots/glam/train/lora-0/plots/metrics/success_rate.tsv", _tsv("success_rate", [(1, 0.0), (2, 0.25)]))
    # LLM_RL: the base model (one model), each variant over 3 training seeds and compared with the base model
    for model, g, seeds, per_seed, vs_base, tokens in (
            ("base", (0.21, 0.14, 0.2998), 1, [0.21], None, 32.7),
            ("reinforce_kl", (0.18, 0.11, 0.2667), 3, [0.15, 0.2, 0.19], "no difference: -0.030 [-0.110, +0.050]",
             69.3),
            ("grpo", (0.41, 0.3278, 0.4963), 3, [0.4, 0.45, 0.38], "higher: +0.200 [+0.110, +0.290]", 35.6)):
        headline = _mode(g, seeds=seeds, episodes=100 * seeds)
        _write(root, f"{m}/llm_rl/eval/{model}.json", {"greedy": headline})  # the headline; the whole entry beside
        _write(root, f"{m}/llm_rl/responses/{model}.json",  # the responses
               {"env": ENV, "max_new_tokens": 96,
                "greedy": {**headline, "per_seed": per_seed, "parse_failure": 0.0, "tokens": tokens, "truncated": 0.01,
                           **({"vs_base": vs_base} if vs_base else {})}})
    for variant in ("reinforce_kl", "grpo"):
        for seed in (0, 1, 2):
            _write(root, f"plots/llm_rl/train/{variant}/seed-{seed}/plots/metrics/train/average_reward.tsv",
                   _tsv("average_reward", [(0, 0.0), (1, 0.125 * seed), (2, 0.25)]))
    # LLM4Teach
    door = f"{m}/llm4teach/eval/simpledoorkey"
    _write(root, f"{door}/teacher_oracle.json",
           {"env": ENV, "greedy": _mode((1.0, 0.963, 1.0), (0.8816, 0.8684, 0.8942))})
    _write(root, f"{door}/student_oracle.json",
           {"env": ENV, "aulc": 0.175, "beats_random": True, "frames": 30720, "updates": 720,
            "greedy": _mode((0.306, 0.138, 0.476), (0.2683, 0.1236, 0.4114), seeds=5, episodes=500)})
    _write(root, f"{door}/ppo.json", {"env": ENV, "aulc": 0.0, "beats_random": False,
                                      "greedy": _mode((0.0, 0.0, 0.0076), (0.0, 0.0, 0.0), seeds=5, episodes=500)})
    _write(root, f"{door}/random.json", {"env": ENV, "sampled": _mode((0.01, 0.0, 0.0545), (0.006, 0.0, 0.0179))})
    mpe = f"{m}/llm4teach/eval/mpe"
    _write(root, f"{mpe}/student_llm.json", {"env": ENV, "beats_random": True,
                                             "greedy": _mode(ret=(-21.2861, -21.9423, -20.5623), seeds=5,
                                                             episodes=500)})
    _write(root, f"{mpe}/mappo.json", {"env": ENV, "beats_random": False,
                                       "greedy": _mode(ret=(-29.7, -31.5253, -28.0477), seeds=5, episodes=500)})
    _write(root, f"{mpe}/random.json", {"env": ENV, "sampled": _mode(ret=(-27.0866, -28.4351, -25.6288))})
    _write(root, f"{m}/llm4teach/result/simpledoorkey.json", {"met_oracle": False})
    _write(root, f"{m}/llm4teach/claims/simpledoorkey.json", {"greedy": {
        "llm_scores_help": False, "seeds": 5, "episodes": 100, "vs_random_score": 0.21, "vs_random_score_lo": 0.05,
        "vs_random_score_hi": 0.37, "vs_uniform": 0.08, "vs_uniform_lo": -0.06, "vs_uniform_hi": 0.2}})
    _write(root, f"{m}/llm4teach/report.json", {"simpledoorkey": {"result": {
        "met_oracle": False, "mode": "greedy", "ppo_ceiling": 0.5, "statistic": "mean over seeds of per-seed success",
        "target": 0.9}}})
    for item, name in (("simpledoorkey-oracle", "success_rate"), ("simpledoorkey-none", "success_rate"),
                       ("mpe-llm", "return_mean"), ("mpe-none", "return_mean")):
        for seed in (0, 1):
            _write(root, f"plots/llm4teach/train/{item}/seed-{seed}/plots/metrics/{name}.tsv",
                   _tsv(name, [(512, 0.1 * seed), (1024, 0.2 + 0.1 * seed)]))
    # KALM
    levels = ["rephrase", "easy"]
    rows = []
    for row, values in (("babyai-dbc-real", (0.4111, 0.3333)), ("babyai-dbc-imagine", (0.3111, 0.2222)),
                        ("random", (0.2667, 0.2667))):
        for level, value in zip(levels, values):
            rows.append({"benchmark": "babyai", "row": row, "level": level, "value": value,
                         "ci_low": round(value - 0.1, 4), "ci_high": round(value + 0.1, 4), "episodes": 90,
                         "n_seeds": 3, "per_seed": [value] * 3})
    _write(root, f"{m}/kalm/eval/babyai/table.json", {"benchmark": "babyai", "budget": {"seconds": 1.0},
                                                      "grounded_llm": False, "levels": levels, "rows": rows})
    for row, success in (("babyai-dbc-imagine", {"rephrase": 0.3111, "easy": 0.2222, "mean": 0.2667}),
                         ("babyai-dbc-real", {"rephrase": 0.4111, "easy": 0.3333, "mean": 0.3722}),
                         ("random", {"rephrase": 0.2667, "easy": 0.2667, "mean": 0.2667})):
        _write(root, f"{m}/kalm/success/babyai/{row}.json", success)
    for level, replay_success in zip(levels, (0.06, 0.08)):
        _write(root, f"{m}/kalm/imagine_babyai_{level}.json",
               {"env": ENV, "first_step_mae": 0.86672, "last_step_mae": 0.9, "goals": 52, "imagined_steps": 1200,
                "imagined_success": 0.0, "mean_length": 24.0, "seconds": 17.0, "consistent": 20, "written": 20,
                "rollouts": 52, "step_l2": 17.01009, "step_mae": 0.85398, "transitions_per_s": 77.1,
                "replay_success": replay_success, "replay_success_given_imagined": None,
                "replay_success_consistent": 0.05})
    _write(root, "plots/kalm/ground/babyai/0/plots/metrics/loss.tsv", _tsv("loss", [(1, 1.817), (2, 1.63), (3, 1.28)]))
    _write(root, f"{m}/kalm/ground/babyai/0.json", {"env": ENV, "selected_update": 3, "updates": 3})
    (root / "plots/kalm/ground/babyai/plots").mkdir(parents=True)  # a folder of another layout: no seed's curves
    # ProPS
    for method, ret, extra in (("props", (43.2833, 28.1833, 68.1187), {"parse_failure": 0.75, "llm_proposed": 0.625}),
                               ("cem", (200.0, 200.0, 200.0), {})):
        _write(root, f"{m}/props/eval/cartpole/{method}.json",
               {"env": ENV, "greedy": _mode(ret=ret, seeds=3, episodes=60), "train_episodes": 40, **extra})
        fallbacks = {"fallbacks": 1} if "llm_proposed" in extra else {}
        _write(root, f"plots/props/curves/cartpole/{method}/plots/custom/best_return.json",
               [{"episodes": 10, "best_return": 32.3, **fallbacks}, {"episodes": 20, "best_return": ret[0]}])
    _write(root, f"{m}/props/eval/cartpole/props_tuned.json",
           {"env": ENV, "greedy": _mode(ret=(45.3833, 15.6167, 97.9621), seeds=3, episodes=60),
            "parse_failure": 0.8, "llm_proposed": 0.5, "train_episodes": 40})
    _write(root, "plots/props/curves/cartpole/props_tuned/plots/custom/best_return.json",
           [{"episodes": 10, "best_return": 30.1}, {"episodes": 20, "best_return": 45.3833}])
    entry = {"iqm": 1.25, "iqm_lo": 0.9, "iqm_hi": 1.6, "mean": 1.3, "runs": 3, "items": 24}
    _write(root, f"{m}/props/heldout.json", {
        "budget": {"test_functions": 24, "evaluations_per_search": 20},
        "methods": {"props_tuned": {**entry, "improve_share": 0.31, "repeat_share": 0.05, "parse_failure_share": 0.1,
                                    "fallback_share": 0.02},
                    "random_search": {**entry, "iqm": 1.1}},
        "comparisons": {"props_tuned_over_random_search": {"poi": 0.61, "poi_lo": 0.52, "poi_hi": 0.7,
                                                           "paired_difference": 0.15, "paired_lo": 0.03,
                                                           "paired_hi": 0.27, "verdict": "higher"}}})
    _write(root, "plots/props/grpo/0/plots/metrics/validation/score.tsv", _tsv("score", [(0, 0.04), (50, 0.07)]))
    _video(root / "plots/props/videos/cartpole.mp4")
    return root


def _render(root: Path, out: Path, methods=REPORT_SECTIONS, videos: bool = True) -> tuple[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    write_report(collect_report(root, methods, props_videos=videos), out)
    return (out / "index.html").read_text(), (out / "summary.md").read_text()


def _md_row(md: str, *cells: str) -> str:
    """The Markdown table line holding all of ``cells``."""
    lines = [line for line in md.splitlines() if line.startswith("|") and all(f"| {c} |" in line for c in cells)]
    assert len(lines) == 1, f"{cells}: {lines}"
    return lines[0]


TABLE_IDS = ["baselines-BabyAI-GoToLocal-v0", "glam-eval-BabyAI-Text-GoToObjS4-v0", "glam-generalisation",
             "llm_rl-eval", "llm4teach-mpe", "llm4teach-simpledoorkey", "llm4teach-result", "llm4teach-claims",
             "kalm-babyai", "kalm-babyai-claims",
             "kalm-imagination",
             "props-cartpole", "props-heldout", "props-heldout-comparisons"]


def test_every_method_table_with_the_numbers_the_metrics_hold(results, tmp_path):
    html, md = _render(results, tmp_path / "out")
    for table in TABLE_IDS:
        assert f'id="table-{table}"' in html
    for key in REPORT_SECTIONS:
        assert f'<section id="{key}"' in html
    assert "not run" not in html.lower() and "not run" not in md.lower()
    # value, interval, seeds and episodes as written, in both outputs
    _md_row(md, "bot", "greedy", "1.0", "[0.9812, 1.0]", "0.9205", "[0.9143, 0.9268]", "1", "200")
    _md_row(md, "symbolic_ppo", "greedy", "1.0", "[0.9924, 1.0]", "5", "500")
    _md_row(md, "glam_lora", "greedy", "0.11 [0.05, 0.19]", "0.03 [0.0, 0.0851]")  # generalisation matrix
    # a variant over its training seeds: the interval, each seed's accuracy and the claim against the base model
    _md_row(md, "reinforce_kl", "greedy", "0.18", "[0.11, 0.2667]", "3", "300", "0.15 / 0.2 / 0.19",
            "no difference: -0.030 [-0.110, +0.050]", "69.3", "0.01")
    _md_row(md, "grpo", "greedy", "0.41", "[0.3278, 0.4963]", "0.4 / 0.45 / 0.38", "higher: +0.200 [+0.110, +0.290]")
    assert _md_row(md, "base", "greedy", "0.21", "[0.14, 0.2998]", "1", "100").count("| — |") == 1  # no vs base
    for series in ("reinforce_kl seed-0", "reinforce_kl seed-2", "grpo seed-1"):  # one training curve per seed
        assert series in html
    _md_row(md, "student_oracle", "student", "greedy", "0.306", "[0.138, 0.476]", "0.175", "30720", "720")
    # the LLM's scores do not help where one control's paired interval reaches 0
    _md_row(md, "simpledoorkey", "greedy", "random_score: 0.21 [0.05, 0.37]; uniform: 0.08 [-0.06, 0.2]", "no",
            "5", "100")
    _md_row(md, "simpledoorkey", "student_oracle", "greedy", "0.9", "0.5", "not met")
    _md_row(md, "babyai-dbc", "real", "0.4111 [0.3111, 0.5111]", "0.3722", "3", "90")
    _md_row(md, "babyai-dbc", "real + imagined", "0.3111 [0.2111, 0.4111]", "0.2667")
    _md_row(md, "babyai", "easy", "52", "52", "20", "0.08", "—", "0.05", "0.86672", "0.9")
    _md_row(md, "babyai-dbc", "real + imagined", "real data", "overlapping", "overlapping")  # claims by intervals
    _md_row(md, "props", "greedy", "43.2833", "[28.1833, 68.1187]", "3", "60", "40", "0.625", "0.75")
    assert "props: random fallback" in html  # the curve marks where a seed's point was a random fallback
    _md_row(md, "props_tuned", "greedy", "45.3833", "[15.6167, 97.9621]")
    _md_row(md, "props_tuned", "1.25 [0.9, 1.6]", "0.31", "0.05")  # the held-out functions, with reply shares
    _md_row(md, "props_tuned over random_search", "0.61 [0.52, 0.7]", "0.15 [0.03, 0.27]", "higher")
    for text in ("[0.9812, 1.0]", "0.4111 [0.3111, 0.5111]", "[-31.5253, -28.0477]", "43.2833"):
        assert text in html
    # baselines whose metrics say beats_random: false are marked beside their number; the others are not
    assert _md_row(md, "mappo", "-29.7").endswith("| not converged |")
    assert _md_row(md, "ppo", "baseline", "greedy").endswith("| not converged |")
    assert "not converged" not in _md_row(md, "student_llm", "-21.2861")
    assert html.count('class="flag">not converged<') == 2
    # curves inline, the video copied beside the page and linked relatively
    assert html.count("<svg") == 7  # ProPS's GRPO validation curve is the seventh
    assert 'src="videos/cartpole.mp4"' in html and (tmp_path / "out/videos/cartpole.mp4").is_file()
    assert "(videos/cartpole.mp4)" in md


def test_same_results_give_the_same_bytes(results, tmp_path):
    assert _render(results, tmp_path / "a") == _render(results, tmp_path / "b")


@pytest.mark.parametrize("rel", ["metrics/kalm/eval/babyai/table.json", "metrics/kalm/imagine_babyai_easy.json",
                                 "metrics/kalm/success/babyai/random.json", "metrics/llm_rl/responses/grpo.json",
                                 "plots/props/videos/cartpole.mp4", "metrics/llm4teach/report.json",
                                 "plots/llm_rl/train/grpo/seed-1/plots/metrics/train/average_reward.tsv"])
def test_a_missing_result_of_a_listed_method_is_an_error_naming_it(results, tmp_path, rel):
    root = tmp_path / "results"
    shutil.copytree(results, root)
    (root / rel).unlink()
    with pytest.raises(MissingResultError, match=rel.replace(".", r"\.")):
        collect_report(root, REPORT_SECTIONS, props_videos=True)


def test_an_empty_results_folder_is_an_error_naming_it(results, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(results, root)
    for f in (root / "metrics/glam/generalisation/french").iterdir():
        f.unlink()
    with pytest.raises(MissingResultError, match="metrics/glam/generalisation/french"):
        collect_report(root, REPORT_SECTIONS, props_videos=True)


def test_a_switched_off_method_shows_not_run(results, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(results, root)
    shutil.rmtree(root / "metrics/kalm")  # its success files included
    methods = [k for k in REPORT_SECTIONS if k != "kalm"]
    html, md = _render(root, tmp_path / "out", methods)
    assert 'id="table-kalm-babyai"' not in html and 'id="table-glam-generalisation"' in html
    assert "Not run: switched off in params" in html and "## KALM\n\nNot run: switched off in params" in md
    assert html.count("Not run") == 1


def test_videos_switched_off_are_not_required(results, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(results, root)
    (root / "plots/props/videos/cartpole.mp4").unlink()
    html, md = _render(root, tmp_path / "out", videos=False)
    assert "<video" not in html and "Videos not recorded: switched off in params." in md
    assert not (tmp_path / "out/videos").exists()


def test_report_params():
    assert load_section({"report": {}}, "report", ReportParams).methods == list(REPORT_SECTIONS)
    with pytest.raises(ParamsError, match="report.methods: .*twice"):
        load_section({"report": {"methods": ["glam", "glam"]}}, "report", ReportParams)
    with pytest.raises(ParamsError, match=r"report.methods.0"):
        load_section({"report": {"methods": ["glam_v2"]}}, "report", ReportParams)


def _chromium_or_skip():
    """Playwright driving Debian's chromium; without them: a failure under CI, a skip elsewhere."""
    reason = None
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[test]')"
    if reason is None and not CHROMIUM.is_file():
        reason = f"{CHROMIUM} missing (apt-get install chromium; `make test` installs it)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"headless Chromium test cannot run under CI: {reason}")
        pytest.skip(reason)


def test_page_in_headless_chromium(results, tmp_path):
    _chromium_or_skip()
    from playwright.sync_api import sync_playwright

    out = tmp_path / "out"
    _render(results, out)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
            page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}"))
            page.goto((out / "index.html").as_uri(), wait_until="load")
            for key in REPORT_SECTIONS:
                tables = page.locator(f"section#{key} table")
                assert tables.count() >= 1, key
                for i in range(tables.count()):
                    assert tables.nth(i).is_visible(), f"{key} table {i}"
            for table in TABLE_IDS:
                assert page.locator(f"#table-{table}").is_visible(), table
            assert page.locator("figure svg").count() == 7
            # the relative video link resolves and the browser decodes it
            page.wait_for_function("document.querySelector('video').readyState >= 2", timeout=10_000)
            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)
        finally:
            browser.close()
    assert not problems, problems
    assert ARTIFACT.stat().st_size > 10_000
