"""The Prefect UI's view of a run: each stage's task publishes a markdown artifact with the stage's metrics and
logs what the stage printed. Checked against `prefect server start` through Prefect's client API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines.artifacts import artifact_key, read_metrics_files, stage_markdown

from .conftest import ROOT
from .test_pipeline import _dvc, _free_port, _git, _run

# --- the report of one stage, from its metrics files ---


def test_markdown_flattens_nested_numbers_per_file():
    md = stage_markdown("train", "ran in this workspace", 12.34, {
        "metrics/train.json": '{"loss": 0.25, "eval": {"success_rate": 0.75, "env": "text"}, "ok": true}',
        "metrics/curve.json": '{"returns": [1, 2.5]}',
    }, waited=3.0)
    assert "### DVC stage `train`" in md
    assert "**ran in this workspace**, 12.3 s wall time (after 3.0 s waiting" in md
    assert "| metrics/train.json | loss | 0.25 |" in md
    assert "|  | eval.success_rate | 0.75 |" in md  # the file is named on its first row only
    assert "|  | ok | true |" in md
    assert "env" not in md  # strings are no metrics
    assert "| metrics/curve.json | returns.0 | 1 |" in md and "|  | returns.1 | 2.5 |" in md


def test_markdown_notes_missing_and_broken_files_and_keeps_them_past_the_limit():
    numbers = "{" + ", ".join(f'"m{i}": {i}' for i in range(50)) + "}"
    md = stage_markdown("s", "up to date (not run)", 0.01, {
        "many.json": numbers, "gone.json": None, "bad.json": "not json", "conf.yaml": "a: {b: 1.23456789}",
        "text.json": '{"note": "no numbers here"}',
    }, max_rows=5)
    assert "| many.json | m0 | 0 |" in md and "| m4 | 4 |" in md and "m5" not in md
    assert "| gone.json | *missing* |  |" in md
    assert "| bad.json | *not JSON: Expecting value" in md
    assert "| text.json | *no numbers* |  |" in md
    assert "conf.yaml" not in md  # past the limit: counted
    assert "*46 more metrics left out (at most 5 shown" in md
    assert "waiting" not in md
    assert "1.23457" in stage_markdown("s", "ran", 1.0, {"conf.yaml": "a: {b: 1.23456789}"})
    assert "*not YAML" in stage_markdown("s", "ran", 1.0, {"conf.yml": "a: [1"})
    assert "No `metrics:`" in stage_markdown("s", "ran", 1.0, {})
    assert "| a\\|b | 1 |" in stage_markdown("s", "ran", 1.0, {"x.json": '{"a|b": 1}'})  # a pipe stays in its cell


def test_metrics_folders_are_read_file_by_file(tmp_path):
    (tmp_path / "m" / "env").mkdir(parents=True)
    (tmp_path / "m" / "env" / "b.json").write_text('{"x": 2}')
    (tmp_path / "m" / "a.json").write_text('{"x": 1}')
    (tmp_path / "m" / "notes.txt").write_text("skipped")
    (tmp_path / "empty").mkdir()
    assert read_metrics_files(tmp_path, ["m", "empty", "one.json"]) == {
        "m/a.json": '{"x": 1}', "m/env/b.json": '{"x": 2}', "empty": None, "one.json": None}


def test_artifact_keys_follow_prefects_rule():
    assert artifact_key("glam_train@lora-0") == "stage-glam-train-lora-0"
    assert artifact_key("KALM_eval") == "stage-kalm-eval"
    assert artifact_key("@@") == "stage-unnamed"


def test_a_failing_publish_does_not_fail_the_stage(tmp_path, monkeypatch):
    import pipelines.artifacts as artifacts

    def refuse(**kwargs):
        raise ConnectionError("no API")

    warnings = []

    class Log:
        def warning(self, msg, *args):
            warnings.append(msg % args)

    monkeypatch.setattr(artifacts, "create_markdown_artifact", refuse)
    artifacts.publish("s", "ran", 1.0, 0.0, str(tmp_path), ("metrics/gone.json",), Log())
    assert warnings == ["stage s: could not publish its metrics artifact: ConnectionError('no API')"]


# --- against a Prefect server ---

TOY_TRAIN = """
import json, os, sys
loss = 0.25
print(f"toy train: epoch 1 loss {loss}")
print("toy train: a warning on stderr", file=sys.stderr)
os.makedirs("metrics/per_env", exist_ok=True)
json.dump({"loss": loss, "eval": {"success_rate": 0.75, "episodes": 8}, "env": "text"}, open("metrics/train.json", "w"))
json.dump({"return": 1.5}, open("metrics/per_env/a.json", "w"))
json.dump({"return": -2}, open("metrics/per_env/b.json", "w"))
open("metrics/broken.json", "w").write("not json")
open("model.txt", "w").write(str(loss))
"""
TOY_DVC = """
stages:
  toy_train:
    cmd: python train.py
    deps: [train.py]
    outs: [model.txt]
    metrics:
      - metrics/train.json: {cache: false}
      - metrics/per_env
      - metrics/broken.json: {cache: false}
"""


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """`prefect server start` on a free port of 127.0.0.1 with its own PREFECT_HOME (sqlite); its API URL."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() - started > 90:
                    raise RuntimeError(f"Prefect server not up after {time.monotonic() - started:.0f} s:\n"
                                       + (home / "server.log").read_text()[-3000:])
                time.sleep(0.25)
        print(f"Prefect server up in {time.monotonic() - started:.1f} s")
        yield api
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        log.close()


def _artifacts_and_logs(api: str, key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort, LogSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                          sort=ArtifactSort.CREATED_DESC)
        logs = client.read_logs(sort=LogSort.TIMESTAMP_ASC)
    return artifacts, logs


def _task_log(logs, task_run_id) -> str:
    return "\n".join(entry.message for entry in logs if entry.task_run_id == task_run_id)


def test_stage_tasks_publish_metrics_and_output_to_the_server(prefect_api, tmp_path, monkeypatch):
    root = tmp_path / "toy"
    root.mkdir()
    (root / "train.py").write_text(TOY_TRAIN)
    (root / "dvc.yaml").write_text(TOY_DVC)
    _git("init", "-q", cwd=root)
    _dvc("init", "-q", cwd=root)
    _git("add", "-A", cwd=root)
    _git("commit", "-qm", "toy", cwd=root)
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    flow = [sys.executable, str(ROOT / "pipelines" / "reproduce.py"), "--root", str(root), "--gpus", "0"]
    key = artifact_key("toy_train")

    assert "toy_train: ran" in _run(flow, root)
    (artifact,), logs = _artifacts_and_logs(prefect_api, key)
    md = artifact.data
    assert artifact.type == "markdown" and artifact.task_run_id is not None
    assert "**ran in this workspace**" in md and "s wall time" in md
    assert "| metrics/train.json | loss | 0.25 |" in md
    assert "|  | eval.success_rate | 0.75 |" in md and "|  | eval.episodes | 8 |" in md
    assert "| metrics/per_env/a.json | return | 1.5 |" in md and "| metrics/per_env/b.json | return | -2 |" in md
    assert "| metrics/broken.json | *not JSON" in md  # noted; the stage still succeeded
    task_log = _task_log(logs, artifact.task_run_id)  # the same task run's log holds what the stage printed
    assert "toy train: epoch 1 loss 0.25" in task_log
    assert "toy train: a warning on stderr" in task_log

    # A changed stage in a parallel clone: a second version of the artifact, from the clone's run.
    (root / "train.py").write_text(TOY_TRAIN.replace("loss = 0.25", "loss = 0.5"))
    assert "toy_train: ran" in _run([*flow, "--workers", "1"], root)
    (latest, first), logs = _artifacts_and_logs(prefect_api, key)
    assert first.id == artifact.id
    assert "**ran in clone w0, restored here from DVC's run-cache**" in latest.data
    assert "| metrics/train.json | loss | 0.5 |" in latest.data
    assert "toy train: epoch 1 loss 0.5" in _task_log(logs, latest.task_run_id)
