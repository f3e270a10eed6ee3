"""Stage props_grpo: GRPO fine-tuning (TRL + LoRA) of the ProPS optimizer LLM on scored MountainCarContinuous points.

Reads ``props.space`` (the one parameter range), ``props.search.max_episode_steps`` (the task's horizon, the one
the search runs and states) and ``props.grpo``; the prompts are the search's own chats (its system message
included) and the completions continue the assistant turn opened with ``props.grpo.answer_prefix`` (the search's
opening at the CPU default). Writes the LoRA adapter
``models/props/grpo`` (byte-stable), ``data/props/grpo/`` (every scored vector with its split, seeds and returns;
every sampled completion with its prefix and four rewards; the rendered first prompt), ``metrics/props/grpo.json``
(rewards, the share of replies the search's parser accepts at the first and last step) and dvclive curves under
``plots/props/grpo``.

Several devices: ``accelerate launch --multi_gpu --num_processes N -m stages.props_grpo`` runs TRL's GRPO with DDP:
each process samples and scores its 1/N of every micro-batch (``llmrl.algos.grpo``); the main process gathers every
process's completions and writes the outputs.
"""

import contextlib
import json
import tempfile
import time

import torch
from datasets import Dataset

from llmrl.algos.grpo import build_grpo_trainer, gather_records, recording, save_adapter, train
from llmrl.algos.props_grpo import RewardSettings, fine_tune_data, make_reward_funcs, training_summary
from llmrl.config.props import PropsGRPOParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import get_task
from llmrl.fingerprint import fingerprint_line
from llmrl.files import write_json, write_text
from llmrl.llm.load import load_model, render_chat
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, model_spec, open_live, stage_arguments, stage_params
from stages.launch import launched

OUT = paths.props_grpo()
ADAPTER, DATA, METRICS, PLOTS = OUT.adapter, OUT.data, OUT.metrics, OUT.live


def jsonl(rows) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    stage_arguments("props_grpo", argv)
    space = stage_params("props.space", PropsSpaceParams)
    p = stage_params("props.grpo", PropsGRPOParams)
    search = stage_params("props.search", PropsSearchParams)
    seed_everything(p.seed)
    torch.set_num_threads(p.threads)
    t0 = time.perf_counter()
    task = get_task(p.task, search.max_episode_steps.get(p.task))  # at the horizon the search runs it
    data = fine_tune_data(task, p, space)
    log.info("%d vectors scored over %d episodes in %.1f s (mean return %.2f); %d train / %d test prompts",
             p.vectors, p.episodes, time.perf_counter() - t0, data.vectors.returns.mean(), len(data.train),
             len(data.test))

    launch = launched(p.device, own_loop=False)  # TRL's trainer runs DDP over the processes itself
    llm = load_model(model_spec(p.model), device=launch.device, dtype=p.dtype)  # plain: TRL attaches the adapter
    n_params = len(data.records["train"][0]["old_params"])
    reward_settings = RewardSettings(task=task, n_params=n_params, low=space.low, high=space.high,
                                     return_floor=p.return_floor, return_span=p.return_span)
    rewards = make_reward_funcs(reward_settings)
    completions: list[dict] = []
    rows: list[dict] = []
    ADAPTER.parent.mkdir(parents=True, exist_ok=True)
    t_train = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".props_grpo_trl.", dir=ADAPTER.parent) as trl_dir, \
            open_live(PLOTS) if launch.is_main else contextlib.nullcontext() as live:
        run = build_grpo_trainer(llm, Dataset.from_list(data.records["train"]),
                                 recording(rewards, completions, keys=("id", "answer_prefix")), p.trainer, trl_dir)
        for row in train(run):
            rows.append(row)
            if not launch.is_main:
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
        completions = gather_records(completions)  # a collective: every process takes part
        if not launch.is_main:
            return
        save_adapter(run.trainer.model, ADAPTER, base_model=p.model)

    write_text(DATA / "vectors.jsonl", jsonl(data.vector_rows()))
    write_text(DATA / "completions.jsonl", jsonl(completions))
    write_text(DATA / "test_prompts.jsonl", jsonl(data.records["test"]))
    write_text(DATA / "prompt_example.txt", render_chat(llm.tokenizer, data.records["train"][0]["prompt"]))
    summary = training_summary(rows, completions, data.vectors, reward_settings)
    metrics = {
        "steps": summary["steps"],
        "completions": summary["completions"],
        "train_prompts": len(data.train),
        "test_prompts": len(data.test),
        "truncated_prompts": run.truncated_prompts,
        "answer_prefix": p.answer_prefix,
        **{k: summary[k] for k in ("accepted_rate_first_last", "accepted_rate_all", "reward_mean_first_last",
                                   "format_hard_rate_first_last", "format_hard_rate_all")},
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
