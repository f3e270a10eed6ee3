"""Math data sets in one JSONL format: ``{id, problem, solution, answer, source}`` per line.

Sources: reasoning-gym's ``gsm_symbolic`` (GSM8K-derived templates with GSM8K-style solutions, offline), GSM8K (``openai/gsm8k`` on the hub, or local JSONL/JSON/parquet files with ``question`` and
``answer``), MATH (hendrycks-style records with ``problem`` and a ``solution`` whose last ``\\boxed{}`` is the
answer; on the hub ``EleutherAI/hendrycks_math``), and the procedurally generated default
(``llmrl.envs.word_problems.generator``). Every solution ends with "The answer is: X", GSM8K's ``#### X`` is rewritten to it
(as LLM_RL's postprocessing did), and its ``<<48/2=24>>`` calculator annotations are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from llmrl.config.llm_rl import MathDataParams
from llmrl.envs.word_problems.answers import ANSWER_PHRASE, last_boxed, normalize_answer
from llmrl.envs.word_problems.generator import generated_splits
from llmrl.files import atomic_path, verify_checksums

__all__ = ["MathDataError", "HUB", "normalize_gsm8k", "normalize_math", "gsm_symbolic_splits", "read_records",
           "load_hub", "normalize", "problem_splits", "check_disjoint", "write_jsonl", "read_jsonl"]

FIELDS = ("id", "problem", "solution", "answer")


class MathDataError(ValueError):
    """A math data file or record that cannot be used; the message names the file and field."""


def normalize_gsm8k(record: dict, rid: str) -> dict:
    """A GSM8K record (``question``, ``answer`` = rationale + ``#### X``) in the common format."""
    for key in ("question", "answer"):
        if key not in record:
            raise MathDataError(f"GSM8K record {rid}: missing field {key!r} (has {sorted(record)})")
    if "####" not in record["answer"]:
        raise MathDataError(f"GSM8K record {rid}: field 'answer' has no '#### <answer>' line")
    rationale, final = record["answer"].rsplit("####", 1)
    answer = final.strip().replace(",", "")
    lines = [line.strip() for line in rationale.strip().split("\n") if line.strip()]
    return {"id": rid, "problem": record["question"].strip(),
            "solution": "\n".join([*lines, f"{ANSWER_PHRASE} {answer}"]), "answer": answer, "source": "gsm8k"}


def normalize_math(record: dict, rid: str) -> dict:
    """A MATH record (``problem``, ``solution`` with a boxed answer) in the common format."""
    for key in ("problem", "solution"):
        if key not in record:
            raise MathDataError(f"MATH record {rid}: missing field {key!r} (has {sorted(record)})")
    boxed = last_boxed(record["solution"])
    if boxed is None:
        raise MathDataError(f"MATH record {rid}: field 'solution' has no \\boxed{{}} answer")
    answer = normalize_answer(boxed) if re.fullmatch(r"[-\d.,/ ]+", boxed.strip()) else boxed.strip()
    out = {"id": rid, "problem": record["problem"].strip(),
           "solution": record["solution"].strip() + f"\n{ANSWER_PHRASE} {answer}", "answer": answer,
           "source": "math"}
    for extra in ("level", "type"):
        if extra in record:
            out[extra] = record[extra]
    return out


# reasoning-gym appends this instruction to every gsm_symbolic question; the project's prompt asks for its own
# answer line ("The answer is: X"), so it is dropped.
GSM_SYMBOLIC_SUFFIX = " Give the result as your final answer. Do not include units."


def gsm_symbolic_splits(n_train: int, n_test: int, seed: int, test_templates: float = 0.2
                        ) -> tuple[list[dict], list[dict]]:
    """Train and test records from reasoning-gym's ``gsm_symbolic`` generator (GSM8K problems turned into
    templates; solutions in GSM8K's format, read as GSM8K records are). A seeded share ``test_templates`` of the
    templates is test-only, so no test problem is a train problem with new numbers; ``key`` names the template.
    Raises ``MathDataError`` when the templates cannot give the asked counts."""
    import reasoning_gym
    from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import tasks_ok

    templates = sorted(tasks_ok)
    held_out = set(random.Random(seed).sample(templates, max(1, round(test_templates * len(templates)))))
    size = 20 * (n_train + n_test)  # items are generated on access; this only bounds the search
    data = reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    seen: set[str] = set()
    for i in range(size):
        if all(len(splits[k]) >= want[k] for k in splits):
            break
        template = data.task_indices[i]
        split = "test" if template in held_out else "train"
        if len(splits[split]) >= want[split]:
            continue
        item = data[i]
        question = item["question"].removesuffix(GSM_SYMBOLIC_SUFFIX).strip()
        if question in seen:
            continue
        seen.add(question)
        record = normalize_gsm8k({"question": question, "answer": item["metadata"]["answer_cot"]},
                                 f"gsm_symbolic-{seed}-{i}")
        if normalize_answer(record["answer"]) != normalize_answer(str(item["answer"])):
            raise MathDataError(f"gsm_symbolic item {i} (template {template}): solution ends with "
                                f"{record['answer']!r}, answer field is {item['answer']!r}")
        splits[split].append({**record, "source": "gsm_symbolic", "key": f"template-{template}"})
    short = {k: f"{len(v)} of {want[k]}" for k, v in splits.items() if len(v) < want[k]}
    if short:
        raise MathDataError(f"gsm_symbolic: too few distinct problems for {short} (seed {seed}, "
                            f"{len(held_out)} of {len(templates)} templates held out for test)")
    return splits["train"], splits["test"]


def read_records(path: str | os.PathLike) -> list[dict]:
    """Records from a ``.jsonl``, ``.json`` (a list) or ``.parquet`` file."""
    path = Path(path)
    if not path.is_file():
        raise MathDataError(f"{path}: file not found")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise MathDataError(f"{path}: a .json data file must hold a list of records")
        return data
    if suffix == ".jsonl":
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise MathDataError(f"{path}:{n}: not valid JSON ({err.msg})") from None
        return out
    raise MathDataError(f"{path}: unknown data file type {suffix!r} (use .jsonl, .json or .parquet)")


def load_hub(name: str, config: str | None, split: str) -> list[dict]:
    """Records of one split of a hub data set (needs a network or a filled HF cache)."""
    import datasets

    return list(datasets.load_dataset(name, config, split=split))


def normalize(records: Iterable[dict], kind: str, prefix: str) -> list[dict]:
    """Common-format records; ids are ``<prefix>-<index>`` unless the record has its own ``id``."""
    fn = {"gsm8k": normalize_gsm8k, "math": normalize_math}[kind]
    return [fn(r, str(r.get("id", f"{prefix}-{i}"))) for i, r in enumerate(records)]


# The real sources on the hub: the data set and the configs whose records are concatenated (MathDataParams.hub_name
# and hub_configs override them).
HUB = {"gsm8k": ("openai/gsm8k", ["main"]),
       "math": ("EleutherAI/hendrycks_math", ["algebra", "counting_and_probability", "geometry",
                                              "intermediate_algebra", "number_theory", "prealgebra", "precalculus"])}


def problem_splits(p: MathDataParams, root: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """LLM_RL's train and test problems from the source ``p`` names: the embedded generator, reasoning-gym's
    gsm_symbolic templates, or GSM8K / MATH from local files (``p.train_path``, ``p.test_path``, relative to
    ``root``) or the hub. A real set's train split is shuffled by ``p.seed`` (its first items become the few-shot
    examples), then both are cut to ``p.n_train`` and ``p.n_test``; the splits are checked disjoint."""
    if p.source == "generated":
        train, test = generated_splits(p.n_train, p.n_test, p.seed, p.two_step_fraction, p.max_number)
    elif p.source == "gsm_symbolic":
        train, test = gsm_symbolic_splits(p.n_train, p.n_test, p.seed, p.test_templates)
    else:
        def split(name: str, path: str | None) -> list[dict]:
            if path is not None:
                return normalize(read_records(Path(root) / path), p.source, f"{p.source}-{name}")
            hub, configs = HUB[p.source]
            hub, configs = p.hub_name or hub, p.hub_configs or configs
            records = [r for config in configs for r in load_hub(hub, config, name)]
            return normalize(records, p.source, f"{p.source}-{name}")

        train, test = split("train", p.train_path), split("test", p.test_path)
        random.Random(p.seed).shuffle(train)
        train, test = train[: p.n_train], test[: p.n_test]
    check_disjoint(train, test)
    return train, test


def check_disjoint(train: Sequence[dict], test: Sequence[dict]) -> None:
    """Raise if any test problem (by id or by whitespace-normalised text) also appears in train."""
    def text(r: dict) -> str:
        return " ".join(r["problem"].split()).lower()

    shared_ids = {r["id"] for r in train} & {r["id"] for r in test}
    shared_text = {text(r) for r in train} & {text(r) for r in test}
    if shared_ids or shared_text:
        raise MathDataError(f"train and test overlap: {len(shared_ids)} ids, {len(shared_text)} problems "
                            f"(e.g. {sorted(shared_ids or shared_text)[:3]})")


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Common-format records; raises ``MathDataError`` naming the file, line and missing field. A file whose
    folder carries a ``SHA256SUMS`` manifest (the llm_rl_data stage's) is checked against it first: a damaged file
    is a ``DamagedFileError`` naming it."""
    path = Path(path)
    if path.is_file():
        verify_checksums(path.parent, [path.name], required=False)
    records = read_records(path)
    for n, r in enumerate(records, 1):
        missing = [k for k in FIELDS if k not in r]
        if missing:
            raise MathDataError(f"{path}: record {n} lacks field(s) {missing}")
    return records
