"""Stage props_grpo: GRPO fine-tuning (TRL + LoRA) of the ProPS optimizer LLM on scored MountainCarContinuous points.

Reads ``props.space`` (the one parameter range) and ``props.grpo``; the completions continue the assistant turn
opened with ``props.grpo.answer_prefix`` (the search's opening at the CPU default). Writes the LoRA adapter
``models/props/grpo`` (byte-stable), ``data/props/grpo/`` (every scored vector with its split, seeds and returns;
every sampled completion with its prefix and four rewards; the rendered first prompt), ``metrics/props/grpo.json``
(rewards, the share of replies the search's parser accepts at the first and last step) and dvclive curves under
``plots/props/grpo``.

Several devices: ``accelerate launch --multi_gpu --num_processes N stages/props_grpo.py`` runs TRL's GRPO with DDP:
each process samples and scores its 1/N of every micro-batch (``llmrl.algos.grpo``); the main process gathers every
process's completions and writes the outputs.
"""

from common import log, model_spec, open_live, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import contextlib
import json
import os
import tempfile
import time

import torch
from datasets import Dataset

from llmrl.algos.grpo import build_grpo_trainer, gather_records, recording, save_adapter, train
from llmrl.algos.props_grpo import RewardSettings, accepted_replies, build_records, make_reward_funcs, \
    sample_scored_vectors, split_indices
from llmrl.algos.props_prompts import PromptSettings
from llmrl.config.props import PropsGRPOParams, PropsSpaceParams
from llmrl.envs.control import get_task
from llmrl.fingerprint import fingerprint_line
from llmrl.files import write_json, write_text
from llmrl.llm import load_model
from llmrl.llm.load import render_chat
from llmrl.seeding import seed_everything

OUT = paths.props_grpo()
ADAPTER, DATA, METRICS, PLOTS = OUT.adapter, OUT.data, OUT.metrics, OUT.live


def jsonl(rows) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def main() -> None:
    space = stage_params("props.space", PropsSpaceParams)
    p = stage_params("props.grpo", PropsGRPOParams)
    seed_everything(p.seed)
    torch.set_num_threads(p.threads)
    t0 = time.perf_counter()
    task = get_task(p.task)

    # Data: vectors from the one range, scored; 80/20 split; only the train split is trained on.
    data = sample_scored_vectors(task, p.vectors, p.episodes, low=space.low, high=space.high,
                                 decimals=space.decimals, seed=p.seed, max_episode_steps=p.max_episode_steps)
    train_idx, test_idx = split_indices(p.vectors, p.test_fraction, p.seed)
    settings = PromptSettings(low=space.low, high=space.high, decimals=space.decimals,
                              step_size=p.step_size or task.step_size,
                              optimum=task.optimum if p.optimum_hint else None, episodes=p.episodes)
    rollout_seed_base = (p.seed + 1) * 1_000_000_000  # reward rollouts never reuse a scoring episode's seed
    records = {split: build_records(task, data, idx, settings, iteration=p.iteration,
                                    total_iterations=p.total_iterations, rollout_seed_base=rollout_seed_base,
                                    answer_prefix=p.answer_prefix)
               for split, idx in (("train", train_idx), ("test", test_idx))}
    data_s = time.perf_counter() - t0
    log.info("%d vectors scored over %d episodes in %.1f s (mean return %.2f); %d train / %d test prompts",
             p.vectors, p.episodes, data_s, data.returns.mean(), len(train_idx), len(test_idx))

    state = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # accelerate launch: TRL's trainer runs DDP over the processes
        from accelerate import PartialState

        # cpu=True for processes on CPU: without it and without CUDA each process would run alone
        state = PartialState(cpu=p.device == "cpu" if p.device is not None else not torch.cuda.is_available())
    main_process = state is None or state.is_main_process
    spec = model_spec(p.model)
    llm = load_model(spec, device=str(state.device) if state is not None else p.device,
                     dtype=p.dtype)  # plain: TRL attaches the adapter
    n_params = len(records["train"][0]["old_params"])
    reward_settings = RewardSettings(task=task, n_params=n_params, low=space.low, high=space.high,
                                     return_floor=p.return_floor, return_span=p.return_span,
                                     max_episode_steps=p.max_episode_steps)
    rewards = make_reward_funcs(reward_settings)
    completions: list[dict] = []
    rows: list[dict] = []
    ADAPTER.parent.mkdir(parents=True, exist_ok=True)
    t_train = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".props_grpo_trl.", dir=ADAPTER.parent) as trl_dir, \
            open_live(PLOTS) if main_process else contextlib.nullcontext() as live:
        run = build_grpo_trainer(llm, Dataset.from_list(records["train"]),
                                 recording(rewards, completions, keys=("id", "answer_prefix")), p.trainer, trl_dir)
        for row in train(run):
            rows.append(row)
            if not main_process:
                continue
            for key, value in row.items():
                if key != "step":
                    live.log_metric(f"train/{key}", value)
            live.next_step()
            log.info("step %d: reward %.3f (format soft %.2f, hard %.2f, policy %.3f, improvement %.3f), loss %.4f",
                     row["step"], row.get("reward_mean", float("nan")), row.get("reward_format_soft", float("nan")),
                     row.get("reward_format_hard", float("nan")), row.get("reward_policy", float("nan")),
                     row.get("reward_improvement", float("nan")), row["loss"])
        train_s = time.perf_counter() - t_train
        completions = gather_records(completions)
        if not main_process:
            return
        save_adapter(run.trainer.model, ADAPTER, base_model=p.model)

    held_out = set(test_idx.tolist())
    vectors = [{"id": i, "split": "test" if i in held_out else "train",
                "params": data.params[i].tolist(), "returns": data.returns[i].tolist(),
                "seeds": data.seeds[i].tolist()} for i in range(p.vectors)]
    write_text(DATA / "vectors.jsonl", jsonl(vectors))
    write_text(DATA / "completions.jsonl", jsonl(completions))
    write_text(DATA / "test_prompts.jsonl", jsonl(records["test"]))
    write_text(DATA / "prompt_example.txt", render_chat(llm.tokenizer, records["train"][0]["prompt"]))

    def first_last(key: str) -> list[float | None]:
        values = [r[key] for r in rows if key in r]
        return [values[0], values[-1]] if values else [None, None]

    # The search's acceptance of each whole reply (prefix + completion) by its strict parser: 1 - its parse failures.
    accepted = accepted_replies([c["completion"] for c in completions],
                                [data.params[c["id"]].tolist() for c in completions],
                                [c["answer_prefix"] for c in completions], settings=reward_settings)
    steps = sorted({c["step"] for c in completions})

    def accepted_at(step) -> float:
        at = [a for a, c in zip(accepted, completions) if c["step"] == step]
        return round(sum(at) / len(at), 4)

    metrics = {
        "steps": len(rows),
        "completions": len(completions),
        "train_prompts": len(train_idx),
        "test_prompts": len(test_idx),
        "truncated_prompts": run.truncated_prompts,
        "answer_prefix": p.answer_prefix,
        "accepted_rate_first_last": [accepted_at(steps[0]), accepted_at(steps[-1])] if steps else [None, None],
        "accepted_rate_all": round(sum(accepted) / len(accepted), 4) if accepted else None,
        "reward_mean_first_last": first_last("reward_mean"),
        "format_hard_rate_first_last": first_last("reward_format_hard"),
        "format_hard_rate_all": (sum(c["reward_format_hard"] for c in completions) / len(completions)
                                 if completions else None),
        "seconds": round(time.perf_counter() - t0, 1),
        "train_seconds": round(train_s, 1),
        "dtype": llm.dtype_name,
        "env": fingerprint_line(),
    }
    write_json(METRICS, metrics)
    log.info("props_grpo: %d steps, %d completions in %.0f s (train %.0f s); accepted by the parser %s; "
             "format-hard %s; reward %s", metrics["steps"], metrics["completions"], metrics["seconds"], train_s,
             metrics["accepted_rate_first_last"], metrics["format_hard_rate_first_last"],
             metrics["reward_mean_first_last"])


if __name__ == "__main__":
    main()
