"""Every other on-disk format a stage reads refuses damage by name: metrics and other JSON
(``read_json``), LLM reply caches (a damaged entry is a recorded miss), restart points (a damaged one is discarded
and named), and saved models (safetensors folders, peft adapters, torch ``.pt`` of the student, the GLAM agent and
Symbolic-PPO, d3rlpy ``.d3``, KALM's grounded-model folder: a ``SHA256SUMS`` manifest checked before anything is
parsed).

Each format gets a property test: random byte ranges of a written file (manifests included) are overwritten,
bit-flipped or zeroed; the read returns the original value exactly or fails with the format's named error.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmrl.checkpoint import load_resumable, run_identity, save_checkpoint
from llmrl.files import CHECKSUMS_FILE, DamagedFileError, read_json, verify_checksums, write_checksums, write_json
from llmrl.llm.backends import CachedBackend, CacheMissError, ReplyCache
from llmrl.llm.generate import Generation, SamplingConfig

PROPERTY = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@st.composite
def damage(draw, size: int):
    """(start, patch): a range of 1 byte to 4 KB of a ``size``-byte file, overwritten with random bytes, with
    its bits flipped (``None`` patch, filled in by ``apply``) or zeroed."""
    start = draw(st.integers(0, size - 1))
    length = min(size - start, draw(st.sampled_from([1, 2, 3, 8, 16, 64, 512, 4096])))
    how = draw(st.sampled_from(["random", "flip", "zero"]))
    patch = {"random": draw(st.binary(min_size=length, max_size=length)), "flip": None, "zero": bytes(length)}[how]
    return start, length, patch


def apply(original: bytes, start: int, length: int, patch: bytes | None) -> bytes:
    patch = bytes(b ^ 0xFF for b in original[start:start + length]) if patch is None else patch
    return original[:start] + patch + original[start + length:]


# ---------------------------------------------------------------------------------------------- JSON (metrics)
METRICS = {"greedy": {"success": 0.967, "success_lo": 0.94, "success_hi": 0.982, "seeds": 3, "episodes": 300},
           "env": "AMD EPYC | AVX2 | 1 thread", "beats_random": True, "aulc": -0.0, "note": "grün"}


@PROPERTY
@given(data=st.data())
def test_damaged_json_is_named_never_read_as_other_numbers(tmp_path, data):
    path = tmp_path / "metrics.json"
    write_json(path, METRICS)
    original = path.read_bytes()
    path.write_bytes(apply(original, *data.draw(damage(len(original)))))
    try:
        assert read_json(path) == METRICS
    except DamagedFileError as err:
        assert "metrics.json" in str(err)


def test_the_report_names_a_damaged_metrics_file(tmp_path):
    from llmrl.report import collect_report

    path = tmp_path / "metrics/baselines/eval/BabyAI-GoToLocal-v0/bot.json"
    write_json(path, METRICS)
    assert "0.967" in collect_report(tmp_path, ["baselines"], props_videos=False).sections[0].tables[0].rows[0]
    text = path.read_text()
    path.write_text(text.replace("0.967", "0.867"))  # a digit flipped on disk: still valid JSON
    with pytest.raises(DamagedFileError, match="bot.json: field 'checksum' does not match"):
        collect_report(tmp_path, ["baselines"], props_videos=False)


def test_a_json_object_cannot_hide_the_checksum_key(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        write_json(tmp_path / "x.json", {"checksum": 1})


# ---------------------------------------------------------------------------------------------- reply cache
PROMPT = [{"role": "user", "content": "Agent sees <key>. Plan?"}, {"role": "assistant", "content": "Action: {"}]
SAMPLING = SamplingConfig(max_new_tokens=8, temperature=0.9, seed=3)
REPLY = Generation(prompt="<rendered>", text="go to <key>}", finish_reason="stop", n_tokens=5)


class _Counting:
    model_id = "local:tiny"

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, sampling):
        self.calls += 1
        return [REPLY] * len(prompts)


@PROPERTY
@given(data=st.data())
def test_a_damaged_reply_is_a_recorded_miss_never_a_wrong_reply(tmp_path, data):
    root = tmp_path / "replies"
    shutil.rmtree(root, ignore_errors=True)
    first = CachedBackend(_Counting(), ReplyCache(root))
    assert first.generate([PROMPT], SAMPLING) == [REPLY]
    (entry,) = root.rglob("*.json")
    original = entry.read_bytes()
    entry.write_bytes(apply(original, *data.draw(damage(len(original)))))
    offline = CachedBackend(_Counting(), ReplyCache(root), offline=True)
    try:
        got = offline.generate([PROMPT], SAMPLING)
    except CacheMissError as err:  # offline, a damaged entry is a miss that names itself
        assert offline.stats.damaged == [str(entry)] and "damaged entries" in str(err)
        online = CachedBackend(backend := _Counting(), ReplyCache(root))
        assert online.generate([PROMPT], SAMPLING) == [REPLY] and backend.calls == 1  # asked again, then cached
        assert online.stats.damaged == [str(entry)] and read_json(entry)["generation"]["text"] == REPLY.text
    else:
        assert got == [REPLY] and offline.stats.hits == 1 and not offline.stats.damaged


def test_an_entry_answering_another_request_is_not_served(tmp_path):
    """An intact entry copied under another key (another prompt's file name): a recorded miss."""
    cache = ReplyCache(tmp_path)
    backend = CachedBackend(_Counting(), cache)
    backend.generate([PROMPT], SAMPLING)
    other = ReplyCache.key("local:tiny", [{"role": "user", "content": "another"}], SAMPLING, 0)
    (src,) = tmp_path.rglob("*.json")
    dst = tmp_path / other[:2] / f"{other}.json"
    dst.parent.mkdir(exist_ok=True)
    shutil.copy(src, dst)
    assert cache.get(other) is None and cache.damaged == [str(dst)]


# ---------------------------------------------------------------------------------------------- restart points
def _state():
    torch.manual_seed(0)
    return {"update": 3, "weights": {"w": torch.randn(16, 8), "b": torch.zeros(8)}, "rng": torch.get_rng_state(),
            "rows": [{"iteration": 1, "loss": 0.25}]}


@PROPERTY
@given(data=st.data())
def test_a_damaged_restart_point_is_discarded_by_name_never_resumed(tmp_path, data, caplog):
    ident = run_identity({"lr": 1e-3})
    path = tmp_path / "checkpoint.pt"
    state = _state()
    save_checkpoint(path, state, ident)
    original = path.read_bytes()
    path.write_bytes(apply(original, *data.draw(damage(len(original)))))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llmrl.checkpoint"):
        got = load_resumable(path, ident)
    if got is None:
        assert f"checkpoint {path} discarded" in caplog.text and not path.exists()
    else:
        assert got["update"] == 3 and got["rows"] == state["rows"] and torch.equal(got["rng"], state["rng"])
        assert all(torch.equal(got["weights"][k], v) for k, v in state["weights"].items())


# ---------------------------------------------------------------------------------------------- model folders
def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file())


def _damage_a_file(folder: Path, data) -> tuple[Path, bytes]:
    files = _files(folder)
    target = data.draw(st.sampled_from(files), label="file")
    original = target.read_bytes()
    if original:
        target.write_bytes(apply(original, *data.draw(damage(len(original)))))
    return target, original


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory, tiny_llm):
    """One saved folder per model format: safetensors model, peft adapter, student .pt, d3rlpy, GLAM agent
    (``agent.pt`` + ``meta.json``), Symbolic-PPO (``<seed>/model.pt``) and KALM's grounded model (adapter, heads,
    spec)."""
    from peft import get_peft_model

    from llmrl.agents.llm_policy import build_agent, save_agent
    from llmrl.agents.offline_policy import save_learnable
    from llmrl.agents.student import MLPStudent, save_student
    from llmrl.agents.symbolic import SymbolicActorCritic, save_symbolic
    from llmrl.algos.grpo import save_adapter
    from llmrl.data.embeddings import InstructionProjection
    from llmrl.config.lora import LoraSettings
    from llmrl.llm.grounded import GroundingSpec, build_grounded
    from llmrl.llm.load import save_model
    from llmrl.llm.load import load_model, peft_lora_config

    root = tmp_path_factory.mktemp("models")
    save_model(tiny_llm.model, tiny_llm.tokenizer, root / "base")
    base = load_model(str(root / "base")).model
    save_adapter(get_peft_model(base, peft_lora_config(LoraSettings(r=2, alpha=4), base)), root / "adapter",
                 base_model=str(root / "base"))
    torch.manual_seed(0)
    save_student(root / "student" / "student.pt", MLPStudent(6, 3, (8,)), {"run": {"seed": 0}})
    import d3rlpy

    learnable = d3rlpy.algos.DiscreteBCConfig(batch_size=4).create(device=False)
    learnable.create_impl((4,), 2)
    projection = InstructionProjection.fit(np.random.default_rng(0).normal(size=(5, 2)), 2)  # a kalm_offline model's
    save_learnable(learnable, root / "d3" / "model.d3", projection, egocentric=False)
    build = {"model": "tiny", "variant": "lora", "seed": 0}
    save_agent(build_agent(**build), root / "glam_agent", {"build": build, "history": 1})
    save_symbolic(root / "glam_symbolic", {0: SymbolicActorCritic()},
                  {"env_id": "BabyAI-Text-GoToObjS4-v0", "seeds": [0]})
    build_grounded(GroundingSpec(obs_dim=5, action_dim=3, discrete=False, base_model="tiny",
                                 finetune="lora")).save(root / "kalm_grounded")
    return root


FORMATS = ["base", "adapter", "student", "d3", "glam_agent", "glam_symbolic", "kalm_grounded"]


def _load(kind: str, folder: Path, base: Path):
    """The project's loader of each format (what a stage calls); ``base``: the adapter's base model."""
    from llmrl.agents.llm_policy import load_agent
    from llmrl.agents.offline_policy import OfflinePolicy
    from llmrl.agents.student import load_student
    from llmrl.agents.symbolic import load_symbolic
    from llmrl.llm.grounded import GroundedLM
    from llmrl.llm.load import load_adapter, load_model

    if kind == "base":
        return load_model(str(folder))
    if kind == "adapter":
        return load_adapter(load_model(str(base)).model, folder)
    if kind == "student":
        return load_student(folder / "student.pt")
    if kind == "glam_agent":  # glam_eval's and glam_generalisation's loader
        return load_agent(folder)
    if kind == "glam_symbolic":  # glam_eval's loader
        return load_symbolic(folder, 0)
    if kind == "kalm_grounded":  # kalm_imagine's loader (kalm_eval's too, through GroundedPolicy)
        return GroundedLM.load(folder)
    return OfflinePolicy.load(folder / "model.d3", np.zeros(2, np.float32))


@pytest.mark.parametrize("kind", FORMATS)
def test_every_model_folder_carries_its_manifest(model_folders, kind):
    folder = model_folders / kind
    assert verify_checksums(folder)
    listed = (folder / CHECKSUMS_FILE).read_text().splitlines()
    assert len(listed) == len(_files(folder)) - 1 and all(len(line.split("  ")[0]) == 64 for line in listed)
    _load(kind, folder, model_folders / "base")  # an intact folder loads


@pytest.mark.parametrize("kind", FORMATS)
@PROPERTY
@given(data=st.data())
def test_damaged_model_files_are_named_before_they_are_read(model_folders, tmp_path, kind, data):
    folder = tmp_path / kind
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(model_folders / kind, folder)
    target, original = _damage_a_file(folder, data)
    if target.read_bytes() == original:  # the damage wrote the same bytes
        assert verify_checksums(folder)
        return
    with pytest.raises(DamagedFileError, match=str(target.parent if target.name == CHECKSUMS_FILE else target)):
        verify_checksums(folder)


@pytest.mark.parametrize("kind", FORMATS)
def test_each_loader_refuses_a_damaged_model_by_name(model_folders, tmp_path, kind):
    folder = tmp_path / kind
    shutil.copytree(model_folders / kind, folder)
    weights = max((f for f in _files(folder) if f.name != CHECKSUMS_FILE), key=lambda f: f.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of the largest file (the weights)
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match=f"{weights}: its sha256 differs"):
        _load(kind, folder, model_folders / "base")


def test_a_folder_from_elsewhere_loads_unchecked_ours_must_be_checked(model_folders, tmp_path):
    from llmrl.agents.student import load_student
    from llmrl.llm.load import load_model

    foreign = tmp_path / "downloaded"
    shutil.copytree(model_folders / "base", foreign)
    (foreign / CHECKSUMS_FILE).unlink()
    load_model(str(foreign))  # a hub download or a user's folder has no manifest
    student = tmp_path / "student"
    shutil.copytree(model_folders / "student", student)
    (student / CHECKSUMS_FILE).unlink()
    with pytest.raises(DamagedFileError, match=f"{student / CHECKSUMS_FILE}: missing"):
        load_student(student / "student.pt")


def test_manifest_is_sha256sum_compatible(model_folders):
    import subprocess

    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum on this machine")
    out = subprocess.run(["sha256sum", "--check", "--quiet", CHECKSUMS_FILE], cwd=model_folders / "adapter",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_checksums_are_written_last_and_list_every_file(tmp_path):
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"\x00\x01")
    (folder / "sub" / "b.json").write_text(json.dumps({"x": 1}))
    write_checksums(folder)
    assert [line.split("  ")[1] for line in (folder / CHECKSUMS_FILE).read_text().splitlines()] == ["a.bin",
                                                                                                    "sub/b.json"]
    (folder / "sub" / "b.json").unlink()
    with pytest.raises(DamagedFileError, match="b.json: listed in .* but missing"):
        verify_checksums(folder)


# ---------------------------------------------------------------------------------------------- other inputs
@PROPERTY
@given(data=st.data())
def test_a_damaged_embedding_table_is_named_never_read_as_other_vectors(tmp_path, data):
    from llmrl.data.embeddings import EmbeddingTable

    table = EmbeddingTable(["go to the red ball", "pick up the key", "öffne die Tür"],
                           np.arange(24, dtype=np.float32).reshape(3, 8) / 7)
    path = tmp_path / "embeddings.npz"
    table.save(path)
    original = path.read_bytes()
    path.write_bytes(apply(original, *data.draw(damage(len(original)))))
    try:
        back = EmbeddingTable.load(path)
    except DamagedFileError as err:
        assert "embeddings.npz" in str(err)
    else:
        assert back.instructions == table.instructions and back.embeddings.tobytes() == table.embeddings.tobytes()


@PROPERTY
@given(data=st.data())
def test_a_damaged_problem_file_is_named_never_read_as_other_problems(tmp_path, data):
    from llmrl.envs.word_problems import read_jsonl, write_jsonl

    rows = [{"id": f"p{i}", "problem": f"Tom has {i} apples and buys {i + 3} more. How many?",
             "solution": f"{i} + {i + 3} = {2 * i + 3}", "answer": str(2 * i + 3)} for i in range(5)]
    folder = tmp_path / "llm_rl"
    shutil.rmtree(folder, ignore_errors=True)
    write_jsonl(folder / "train.jsonl", rows)
    write_checksums(folder)  # as the llm_rl_data stage does
    path = folder / "train.jsonl"
    original = path.read_bytes()
    path.write_bytes(apply(original, *data.draw(damage(len(original)))))
    try:
        assert read_jsonl(path) == rows
    except DamagedFileError as err:
        assert "train.jsonl" in str(err)
