"""Stage props_grpo_part: one part of the GRPO fine-tuning (TRL + LoRA) of the ProPS optimizer LLM, for one training
seed; the parts of a seed resume one another, so a run of hundreds of steps is cut into stages of minutes.

``python -m stages.props_grpo_part <part> <parts> <seed>`` trains the steps after part - 1's end up to
ceil(part x max_steps / parts) of ``props.grpo.trainer.max_steps`` (``llmrl.algos.grpo.part_end``; with the searches
below, part - 1 of parts - 1), resuming from part - 1's full checkpoint
(adapter, optimiser, schedule, random states: the parts equal one uncut run). The data are
``props.grpo.data``'s (``llmrl.algos.props_grpo_functions.grpo_data``: optimisation episodes on the train split's
functions at the CPU tiers, the original's scored MountainCar vectors in the paper profile). With
``props.grpo.functions.loop_functions`` (or ``loop_validation_functions``) set, part 1 trains nothing: it runs the
base model's ProPS searches of train and validation functions at ``props.heldout``'s settings
(``search_loop_examples``; sampling from ``props.llm``) and keeps their exchanges as examples
(``search_examples.json``, handed from part to part), and parts 2.. share the steps. Every
``props.grpo.eval_every`` steps, at step 0 and at the last step, the policy answers the validation examples
(``validation_samples`` replies each, fixed seeds) and the adapter with the best validation score is kept
(``llmrl.algos.grpo.BestAdapter``): for function data the mean improvement (the share of the gap to the optimum a
reply closes), for the control recipe the mean total reward; checkpoint selection on validation data only.

Writes ``models/props/grpo_parts/<part>/<seed>/``: ``checkpoint/`` (TRL's, for the next part; not in the last),
``best/`` (the best adapter so far, byte-stable), ``selection.json`` (every validation's step, score and rates),
``search_examples.json`` where searched, and the records so far (``rows.jsonl``: TRL's metrics per step;
``completions.jsonl``: every sampled completion with its rewards; ``validation.jsonl``: every validation reply).
``props_grpo`` publishes the last part's.
"""

import dataclasses
import json
import shutil
import tempfile
import time

import torch
from datasets import Dataset

from llmrl.algos.grpo import (BestAdapter, build_grpo_trainer, checkpoint_path, gather_records, part_end, recording,
                              save_adapter, train, validate_every, validation_replies)
from llmrl.algos.props_grpo_functions import grpo_data, outcome_rates, reply_outcomes, search_loop_examples
from llmrl.algos.props_search import build_optimizer_llm
from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams, PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.files import DiskFullError, atomic_path
from llmrl.files import is_disk_full  # the one test of a full device, shared with atomic_path
from llmrl.llm.load import load_model
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, model_spec, stage_arguments, stage_params
from stages.launch import launched


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


SEARCHED = "search_examples.json"


def searched_examples(p: PropsGRPOParams, seed: int, llm, space: PropsSpaceParams,
                      search: PropsSearchParams) -> dict[str, list[dict]]:
    """The base model's own search examples: ``loop_functions`` train functions per dimension (each training seed its
    own: seed x loop_functions onwards) and ``loop_validation_functions`` validation functions (the same for every
    seed), searched with the loaded base model ``llm``."""
    heldout = stage_params("props.heldout", PropsHeldoutParams)
    llm_p = stage_params("props.llm", PropsLLMParams).model_copy(update={"backend": "local", "spec": p.model})
    optimizer = build_optimizer_llm(llm_p, cache_dir=None, llm=llm)
    f = p.functions
    got = {}
    for split, functions in (("train", range(seed * f.loop_functions, (seed + 1) * f.loop_functions)),
                             ("validation", range(f.loop_validation_functions))):
        start = time.perf_counter()
        got[split] = (search_loop_examples(optimizer, split, functions, p, search, heldout, space, llm_p)
                      if len(functions) else [])
        log.info("the base model's searches of %d %s functions per dimension: %d examples (%d re-asks) in %.0f s",
                 len(functions), split, len(got[split]), sum(ex["attempt"] > 0 for ex in got[split]),
                 time.perf_counter() - start)
    return got


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("props_grpo_part", argv, part="this part, 1..parts",
                           parts="the parts the run is cut into (the pipeline's chain: dvc.yaml, study/dvc.yaml)",
                           seed="training seed (props.grpo.seeds)")
    part, of, seed = int(args.part), int(args.parts), int(args.seed)
    space = stage_params("props.space", PropsSpaceParams)
    p = stage_params("props.grpo", PropsGRPOParams)
    search = stage_params("props.search", PropsSearchParams)
    if seed not in p.seeds:
        raise SystemExit(f"props_grpo_part: seed {seed} is not among props.grpo.seeds {p.seeds}")
    if not 1 <= part <= of:
        raise SystemExit(f"props_grpo_part: part {part} is outside 1..{of}")
    total = p.trainer.max_steps
    if total is None or total < of:
        raise SystemExit(f"props_grpo_part: props.grpo.trainer.max_steps ({total}) must be set and >= the {of} parts")
    searches = p.data == "functions" and bool(p.functions.loop_functions or p.functions.loop_validation_functions)
    if searches and of < 2:
        raise SystemExit("props_grpo_part: the base model's searches take part 1 of the chain; it needs >= 2 parts")
    out = paths.props_grpo_part(part, of, seed).state
    prev = paths.props_grpo_part(part - 1, of, seed).state if part > 1 else None
    seed_everything(seed)
    torch.set_num_threads(p.threads)
    t0 = time.perf_counter()
    cfg = p.trainer.model_copy(update={"seed": seed})
    launch = launched(p.device, own_loop=False)  # TRL's trainer runs DDP over the processes itself
    llm = load_model(model_spec(p.model), device=launch.device, dtype=p.dtype)  # plain: TRL attaches the adapter
    if searches and part == 1:
        searched = searched_examples(p, seed, llm, space, search)
        if launch.is_main:
            with atomic_path(out, is_dir=True) as tmp:
                (tmp / SEARCHED).write_text(json.dumps(searched, sort_keys=True))
                (tmp / "part.json").write_text(json.dumps({"part": part, "of": of, "seed": seed, "last_step": 0,
                                                           "max_steps": total,
                                                           "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
        return
    searched = json.loads((prev / SEARCHED).read_text()) if searches else None
    # with searches, part 1 trained nothing: parts 2..of share the steps
    end = part_end(part - 1, of - 1, total) if searches else part_end(part, of, total)
    data = grpo_data(p, space, search.max_episode_steps.get(p.task), searched)
    after_searches = searches and part == 2  # part 1 trained nothing: no checkpoint, no selection to carry on
    selection = BestAdapter.load(prev) if prev and not after_searches else BestAdapter()
    rows = read_jsonl(prev / "rows.jsonl") if prev else []
    completions = read_jsonl(prev / "completions.jsonl") if prev else []
    validation = read_jsonl(prev / "validation.jsonl") if prev else []
    new_completions: list[dict] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".props_grpo_trl.", dir=out.parent) as trl_dir:
        run = build_grpo_trainer(llm, Dataset.from_list(data.train),
                                 recording(data.reward_funcs, new_completions, keys=data.keys), cfg, trl_dir)
        policy = dataclasses.replace(llm, model=run.trainer.model)

        def evaluate(step: int) -> None:
            replies = validation_replies(policy, data.validation, data.reward_funcs, samples=p.validation_samples,
                                         max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature,
                                         top_p=cfg.top_p, stop_at_newline=cfg.stop_at_newline,
                                         seed=1_000_003 * (seed + 1), weights=cfg.reward_weights)
            reward = sum(r["reward"] for r in replies) / len(replies)
            rates = (outcome_rates(reply_outcomes(replies, data.validation, space.low, space.high), cfg.reward_weights)
                     if p.data == "functions" else {})
            # functions: select on the behaviour the claim is about, the share of the gap closed; the total reward
            # is mostly parsing and novelty, which the search's re-asks and fallback already cover
            score = rates["improvement_mean"] if p.data == "functions" else reward
            best = selection.consider(step, score, run.trainer.model, **rates)
            validation.extend({"step": step, **r} for r in replies)
            log.info("validation at step %d: mean reward %.3f%s%s", step, score,
                     "".join(f", {k} {v}" for k, v in rates.items() if k.endswith("_rate")), " (best)" if best else "")

        validate_every(run, p.eval_every, total, evaluate)
        resume = prev / "checkpoint" if prev and not after_searches else None
        try:
            for row in train(run, resume_from=resume, stop_after=end if part < of else None):
                rows.append(row)
                log.info("step %d/%d: reward %.3f, loss %.4f%s", row["step"], total,
                         row.get("reward_mean", float("nan")), row["loss"],
                         "".join(f", {k[7:]} {v:.3f}" for k, v in row.items()
                                 if k.startswith("reward_") and k not in ("reward_mean", "reward_std")))
        except Exception as err:
            if is_disk_full(err):  # TRL's checkpoint, written beside the output: named as the output's own error
                raise DiskFullError(out, err, "the part's checkpoint") from err
            raise
        completions.extend(gather_records(new_completions))  # a collective: every process takes part
        if not launch.is_main:
            return
        with atomic_path(out, is_dir=True) as tmp:
            if part < of:
                # what resuming reads; TRL's training_args.bin (a pickle naming this run's scratch folder) and model
                # card would make two equal runs' outputs differ
                shutil.copytree(checkpoint_path(run), tmp / "checkpoint",
                                ignore=shutil.ignore_patterns("training_args.bin", "README.md"))
                # peft names the base model by this clone's absolute path and keeps the target modules in a set
                # (its order follows the hash seed): the params' name and a sorted list, as save_adapter writes them
                config = tmp / "checkpoint" / "adapter_config.json"
                cfg_json = json.loads(config.read_text())
                cfg_json["base_model_name_or_path"] = p.model
                if isinstance(cfg_json.get("target_modules"), list):
                    cfg_json["target_modules"] = sorted(cfg_json["target_modules"])
                config.write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
            selection.save(tmp)
            selection.restore(run.trainer.model)
            save_adapter(run.trainer.model, tmp / "best", base_model=p.model)
            write_jsonl(tmp / "rows.jsonl", [{k: v for k, v in r.items() if k != "step_time"} for r in rows])
            write_jsonl(tmp / "completions.jsonl", completions)
            write_jsonl(tmp / "validation.jsonl", validation)
            if searched is not None:
                (tmp / SEARCHED).write_text(json.dumps(searched, sort_keys=True))
            (tmp / "part.json").write_text(json.dumps({"part": part, "of": of, "seed": seed, "last_step": end,
                                                       "max_steps": total, **data.describe,
                                                       "truncated_prompts": run.truncated_prompts,
                                                       "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
    log.info("props_grpo_part %d/%d seed %d: steps to %d in %.0f s; best validation %.3f at step %s", part, of, seed,
             end, time.perf_counter() - t0, selection.best_score, selection.best_step)


if __name__ == "__main__":
    main()
