"""Run identity of resumable trainings: resume only the same run, survive kill -9, and a
stage with a resume point round-trips through a DVC remote (status clean, repro a no-op)."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmrl.agents.llm_policy import build_agent
from llmrl.algos.ppo_llm import train
from llmrl.checkpoint import load_resumable, run_identity, save_checkpoint
from llmrl.config.glam import GlamPPO
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env

from .conftest import ROOT

ENV = "BabyAI-Text-GoToObjS4-v0"
CFG = GlamPPO(n_envs=2, frames_per_env=3, updates=2, epochs=1, minibatch_size=6, micro_batch=3, lr=1e-3)
SKIP = ("fps", "collect_s")


def _strip(h):
    return [{k: v for k, v in r.items() if k not in SKIP} for r in h]


def test_identity_names_what_changed_and_mismatch_is_discarded(tmp_path, caplog):
    model, code = tmp_path / "model", tmp_path / "rule.py"
    model.mkdir()
    (model / "w.bin").write_bytes(b"\x00\x01")
    code.write_text("def update(): return 1\n")
    ident = run_identity({"lr": 1e-3}, inputs={"base_model": model}, code=[code], root=tmp_path)
    ckpt = tmp_path / "c.pt"
    save_checkpoint(ckpt, {"step": 3}, ident)
    same = run_identity({"lr": 1e-3}, inputs={"base_model": model}, code=[code], root=tmp_path)
    assert load_resumable(ckpt, same) == {"step": 3}

    assert run_identity({"lr": 2e-3}, {"base_model": model}, [code], root=tmp_path).changes(ident.to_dict()) == [
        "params"]
    (model / "w.bin").write_bytes(b"\x00\x02")
    code.write_text("def update(): return 2\n")
    changed = run_identity({"lr": 1e-3}, {"base_model": model}, [code], root=tmp_path)
    with caplog.at_level(logging.INFO, logger="llmrl.checkpoint"):
        assert load_resumable(ckpt, changed) is None
    assert "discarded" in caplog.text and "inputs (base_model)" in caplog.text and "code (rule.py)" in caplog.text
    assert not ckpt.exists()  # never resumed later by mistake
    ckpt.write_bytes(b"not a checkpoint")
    assert load_resumable(ckpt, changed) is None and not ckpt.exists()
    with pytest.raises(FileNotFoundError, match="missing"):
        run_identity({}, inputs={"base_model": tmp_path / "missing"})


@pytest.mark.parametrize("change", ["none", "update_function", "base_model"])
def test_glam_resumes_only_an_identical_run(tmp_path, change, caplog):
    model, rule = tmp_path / "base_model", tmp_path / "ppo_llm.py"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"v1")
    rule.write_text((ROOT / "llmrl/algos/ppo_llm.py").read_text())

    def identity():
        return run_identity({"cfg": "x"}, inputs={"base_model": model}, code=[rule], root=tmp_path)

    ckpt = tmp_path / "ckpt.pt"
    for _ in train(build_agent("tiny", "lora", seed=0), lambda: make_env(ENV), CFG, history=3, seed=0,
                   checkpoint=ckpt, identity=identity(), progress=False):
        break  # stopped after update 1
    assert ckpt.is_file()
    if change == "update_function":
        rule.write_text(rule.read_text().replace("ratio = ", "ratio = 1.0 * ", 1))
    elif change == "base_model":
        (model / "weights.bin").write_bytes(b"v2")
    with caplog.at_level(logging.INFO, logger="llmrl.checkpoint"):
        ran = [r["iteration"] for r in train(build_agent("tiny", "lora", seed=0), lambda: make_env(ENV), CFG,
                                             history=3, seed=0, checkpoint=ckpt, identity=identity(), progress=False)
               if not r.get("resumed")]
    if change == "none":
        assert ran == [2] and "resuming" in caplog.text
    else:
        assert ran == [1, 2]  # from scratch
        assert {"update_function": "code (ppo_llm.py)", "base_model": "inputs (base_model)"}[change] in caplog.text


KILL_SCRIPT = """
import json, sys, torch
torch.set_num_threads(1)
from llmrl.agents.llm_policy import build_agent
from llmrl.algos.ppo_llm import train
from llmrl.checkpoint import project_sources, run_identity
from llmrl.config.glam import GlamPPO
import llmrl.envs.babyai_text
from llmrl.envs.make import make_env
cfg = GlamPPO(n_envs=2, frames_per_env=3, updates=5, epochs=1, minibatch_size=6, micro_batch=3, lr=1e-3)
agent = build_agent("tiny", "lora", seed=0)
ident = run_identity({"cfg": repr(cfg)}, code=project_sources())
h = []
for r in train(agent, lambda: make_env("BabyAI-Text-GoToObjS4-v0"), cfg, history=3, seed=0, checkpoint=sys.argv[1],
               identity=ident, progress=False):
    h.append(r)
    if not r.get("resumed"):
        print("update", r["iteration"], flush=True)
skip = ("fps", "collect_s", "resumed")
weights = sum(float(p.double().sum()) for p in agent.parameters() if p.requires_grad)
print("RESULT", json.dumps({"history": [{k: v for k, v in r.items() if k not in skip} for r in h],
                            "weights": weights}), flush=True)
"""


def _result(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT"))[len("RESULT "):])


def test_kill_9_mid_run_resumes_to_identical_metrics(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    straight = subprocess.run([sys.executable, str(script), str(tmp_path / "straight.pt")], env=env,
                              capture_output=True, text=True, check=True)
    ckpt = tmp_path / "killed.pt"
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt)], env=env, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("update 1"):  # printed once update 1's checkpoint is on disk
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and ckpt.is_file()
    resumed = subprocess.run([sys.executable, str(script), str(ckpt)], env=env, capture_output=True, text=True,
                             check=True)
    updates_run = [line for line in resumed.stdout.splitlines() if line.startswith("update ")]
    assert "update 1" not in updates_run and updates_run[-1] == "update 5"  # it resumed, it did not restart
    assert _result(resumed.stdout) == _result(straight.stdout)


STAGE_SCRIPT = """
import json, sys
from pathlib import Path
from llmrl.checkpoint import load_resumable, run_identity, save_checkpoint
steps = 3
ckpt = Path(".cache/resume/train/checkpoint.pt")
ident = run_identity({"steps": steps}, inputs={"data": "data.txt"}, code=[__file__])
state = load_resumable(ckpt, ident) or {"step": 0, "total": 0}
while state["step"] < steps:
    state["step"] += 1
    state["total"] += len(Path("data.txt").read_text()) * state["step"]
    save_checkpoint(ckpt, state, ident)
Path("model").mkdir(exist_ok=True)
Path("model/weights.txt").write_text(str(state["total"]))
Path("metrics.json").write_text(json.dumps({"total": state["total"]}))
ckpt.unlink()
"""

STAGE_DVC = """
stages:
  train:
    cmd: python train.py
    deps: [train.py, data.txt]
    outs: [model]
    metrics:
      - metrics.json:
          cache: false
"""


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def _dvc(*args, cwd):
    return _run([sys.executable, "-m", "dvc", *args], cwd)


def _git(*args, cwd):
    return _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd)


def test_stage_with_resume_point_round_trips_through_a_remote(tmp_path):
    a, remote = tmp_path / "a", tmp_path / "remote"
    a.mkdir()
    _git("init", "-q", cwd=a)
    _dvc("init", "-q", cwd=a)
    _dvc("remote", "add", "-d", "local", str(remote), cwd=a)
    (a / "train.py").write_text(textwrap.dedent(STAGE_SCRIPT))
    (a / "data.txt").write_text("abc")
    (a / "dvc.yaml").write_text(STAGE_DVC)
    (a / ".gitignore").write_text("/.cache/\n")
    out = _dvc("repro", cwd=a)
    assert "Running stage 'train'" in out
    assert json.loads((a / "metrics.json").read_text()) == {"total": 18}
    _dvc("push", cwd=a)
    _git("add", "-A", cwd=a)
    _git("commit", "-qm", "results", cwd=a)

    b = tmp_path / "b"
    _git("clone", "-q", str(a), str(b), cwd=tmp_path)
    _dvc("remote", "add", "-f", "-d", "local", str(remote), cwd=b)
    _dvc("pull", cwd=b)
    assert (b / "model/weights.txt").read_text() == "18"
    assert "up to date" in _dvc("status", cwd=b)
    assert "Running stage" not in _dvc("repro", cwd=b)  # a no-op: nothing retrains


def test_reinforce_kl_resume_equals_uninterrupted_and_other_config_restarts(tmp_path, caplog):
    from llmrl.algos.reinforce_kl import ReinforceKL
    from llmrl.config.llm_rl import ReinforceTrainParams
    from llmrl.config.lora import LoraSettings
    from llmrl.llm.load import load_model
    from llmrl.seeding import seed_everything

    problems = [{"id": f"p{i}", "problem": f"Tom has {i} apples and gets 2 more. How many apples?",
                 "solution": f"{i} + 2 = {i + 2}\nThe answer is: {i + 2}", "answer": str(i + 2)} for i in range(1, 7)]

    def trainer(**common):
        seed_everything(0)
        llm = load_model("tiny:4", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
        cfg = ReinforceTrainParams(
            common={"iterations": 3, "problems_per_iteration": 2, "group_size": 2, "line_tokens": 6,
                    "answer_tokens": 12, "micro_batch": 4, "lr": 1e-2, "temperature": 1.0, **common},
            reinforce_kl={"max_steps": 2, "ref_update_iterations": 2})
        return ReinforceKL(llm, cfg, problems[1:], problems[:1])

    def strip(rows):
        return [({k: v for k, v in s.items() if k not in ("collect_s", "update_s")}, [e.lines for e in eps])
                for s, eps in rows]

    straight = trainer()
    h_straight = strip(list(straight.train(progress=False)))
    ckpt = tmp_path / "rkl.pt"
    first = trainer()
    for stats, _ in first.train(progress=False, checkpoint=ckpt):
        break  # killed after iteration 0's checkpoint
    resumed = trainer()
    h_resumed = strip(list(resumed.train(progress=False, checkpoint=ckpt)))
    assert h_resumed == h_straight
    for a, b in zip(straight.params, resumed.params):
        assert torch.equal(a, b)
    other = trainer(lr=5e-3)  # another config: the checkpoint is not this run's
    with caplog.at_level(logging.INFO, logger="llmrl.checkpoint"):
        rows = list(other.train(progress=False, checkpoint=ckpt))
    assert "changed params" in caplog.text and len(rows) == 3 and rows[0][0]["lr"] == 5e-3
