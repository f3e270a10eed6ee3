"""Stage glam_bc: behavioural cloning of the LLM policy on the BabyAI bot's demonstrations of the training level, one
model per GLAM training seed.

The demonstrations come from the ``demos`` stage (data/demos/<glam.train.env_id>.h5, which therefore lists the
training level in ``demos.envs``): the first ``glam.bc.episodes`` episodes train, the last
``glam.bc.validation_episodes`` validate (the epoch of lowest validation loss is kept; training stops after
``glam.bc.patience`` epochs without one), all recorded with the BabyAI-Text wrapper, so their text observations and
missions are the ones the policy is trained and evaluated on. The demos' seeds (``demos.seed``...) are disjoint from
GLAM's evaluation seeds. Writes models/glam/bc/<seed>/ and metrics/glam/bc.json (per seed: samples, the epoch
kept, and the validation loss and accuracy per epoch: BC's curve).
"""

import time

import torch

from llmrl.agents.llm_policy import build_agent, save_agent
from llmrl.algos.bc_llm import bc_samples, capture_trunks, group_samples, train_bc
from llmrl.config import DemosParams
from llmrl.config.glam import GlamParams
from llmrl.data.trajectories import TrajectoryReader
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.files import atomic_path, write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.glam_bc()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("glam_bc", argv)
    p = stage_params("glam", GlamParams)
    demos = stage_params("demos", DemosParams)
    if p.train.env_id not in demos.envs:
        raise SystemExit(f"glam_bc: demos.envs must include glam.train.env_id {p.train.env_id!r} (BC trains on the "
                         f"demos stage's data); it lists {demos.envs}")
    torch.set_num_threads(p.threads)
    with TrajectoryReader(paths.demos().demos / f"{p.train.env_id}.h5") as reader:
        n = len(reader)
        if p.bc.episodes + p.bc.validation_episodes > n:
            raise SystemExit(f"glam.bc.episodes + glam.bc.validation_episodes: {p.bc.episodes} + "
                             f"{p.bc.validation_episodes} asked, data/demos has {n} episodes")
        train_eps = [reader[i] for i in range(p.bc.episodes)]
        val_eps = [reader[i] for i in range(n - p.bc.validation_episodes, n)]
    env = make_env(p.train.env_id)
    labels, actions = env.get_wrapper_attr("labels"), env.get_wrapper_attr("action_texts")
    summary = {"episodes": len(train_eps), "validation_episodes": len(val_eps),
               "bot_success": round(sum(ep.success for ep in train_eps) / len(train_eps), 4), "seeds": {}}
    trunks = None
    with atomic_path(OUT.model, is_dir=True) as models:
        for seed in p.train.seeds:
            start = time.perf_counter()
            build = {"model": p.model, "variant": "lora", "lora_r": p.lora.r, "lora_alpha": p.lora.alpha,
                     "lora_dropout": p.lora.dropout, "lora_layers": p.lora.layers,
                     "temperature": p.policy.temperature, "length_norm": p.policy.length_norm, "dtype": p.dtype,
                     "seed": p.bc.seed + seed}
            agent = build_agent(**build)
            if trunks is None:  # the prompts and the frozen layers' states are the same for every seed
                train = bc_samples(agent, train_eps, labels, actions, p.policy.history)
                validation = bc_samples(agent, val_eps, labels, actions, p.policy.history)
                trunks = (capture_trunks(agent, group_samples(train)),
                          capture_trunks(agent, group_samples(validation)))
                seen = {s[0] for s in train}
                # at history 1 a small level's validation prompts mostly occur in training too: the curve then shows
                # where fitting stops, not generalisation (recorded so the page can say so)
                summary["validation_prompts_seen_in_training"] = round(
                    sum(s[0] in seen for s in validation) / len(validation), 4)
            steps, epochs = [], []
            for row in train_bc(agent, train, validation=validation, epochs=p.bc.epochs, patience=p.bc.patience,
                                batch_size=p.bc.batch_size, lr=p.bc.lr, seed=p.bc.seed + seed, trunks=trunks):
                if "validation_loss" in row:
                    epochs.append(row)
                else:
                    steps.append(row["loss"])
            best = max(e["epoch"] for e in epochs if e["best"])
            save_agent(agent, models / str(seed), {"build": build, "history": p.policy.history,
                                                    "env_id": p.train.env_id})
            summary["seeds"][str(seed)] = {
                "samples": len(train), "validation_samples": len(validation),
                "distinct_prompts": len(trunks[0]) if trunks[0] is not None else None, "best_epoch": best,
                "epochs_run": epochs[-1]["epoch"], "loss_first": round(steps[0], 4), "loss_last": round(steps[-1], 4),
                "validation_loss": [round(e["validation_loss"], 4) for e in epochs],
                "validation_accuracy": [round(e["validation_accuracy"], 4) for e in epochs],
                "dtype": agent.llm.dtype_name, "seconds": round(time.perf_counter() - start, 1)}
            log.info("bc seed %d: %d samples, validation loss %.3f -> %.3f (epoch %d of %d), accuracy %.2f", seed,
                     len(train), epochs[0]["validation_loss"], epochs[best]["validation_loss"], best,
                     epochs[-1]["epoch"], epochs[best]["validation_accuracy"])
            del agent
    write_json(OUT.metrics, summary)


if __name__ == "__main__":
    main()
