"""Stage glam_train@<variant>-<seed>: PPO of the LLM policy (GLAM) on a BabyAI-Text level.

Resumable: every update ends with an atomic checkpoint in .cache/resume/glam_train/<item>/ (scratch, not a DVC out:
it only serves a restart, so a pushed and pulled clone has nothing uncached), stored with the run identity (params,
the base model's content, the source of every project module loaded). A restarted stage continues from a checkpoint
of the same run, ending with the metrics of an uninterrupted run; any other checkpoint is discarded with a log line.
The checkpoint is removed once the outputs are written.

Several devices: ``accelerate launch --multi_gpu --num_processes N stages/glam_train.py <item>`` trains with DDP
(without CUDA on CPU over gloo; ``--cpu`` would start one process). Every process collects the same rollouts and
trains on its 1/N share of each minibatch (``llmrl.algos.ppo_llm``); the main process writes the outputs, and such
a run keeps no restart point.
"""

from common import ROOT, log, open_live, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip
from paths import RESUME  # isort: skip

import os
import sys
import time

import torch

from llmrl.agents.llm_policy import build_agent, save_agent
from llmrl.algos.ppo_llm import train
from llmrl.checkpoint import project_sources, run_identity
from llmrl.config.glam import GlamParams
from llmrl.envs import make_env
from llmrl.files import write_json


def main() -> None:
    p = stage_params("glam", GlamParams)
    item = sys.argv[1] if len(sys.argv) > 1 else f"{p.train.variants[0]}-{p.train.seeds[0]}"
    variant, _, seed_s = item.rpartition("-")
    if variant not in p.train.variants or not seed_s.isdigit() or int(seed_s) not in p.train.seeds:
        raise SystemExit(f"glam_train: item {item!r} is not <variant>-<seed> of glam.train.variants x seeds")
    seed = int(seed_s)
    out = paths.glam_train(item)
    torch.set_num_threads(p.threads)
    t = p.train
    build = {"model": p.model, "variant": variant, "lora_r": p.lora.r, "lora_alpha": p.lora.alpha,
             "lora_dropout": p.lora.dropout, "lora_layers": p.lora.layers, "temperature": p.policy.temperature,
             "length_norm": p.policy.length_norm, "dtype": p.dtype, "seed": seed}
    accelerator = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by `accelerate launch --num_processes N`
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=not torch.cuda.is_available())
    agent = build_agent(**build, device=str(accelerator.device) if accelerator is not None else None)
    model_dir = ROOT / p.model
    identity = run_identity({"cfg": t.ppo().model_dump(), "history": p.policy.history, "seed": seed, "build": build,
                             "env_id": t.env_id},
                            inputs={"base_model": model_dir} if model_dir.is_dir() else {},
                            code=project_sources(ROOT))
    checkpoint = RESUME / "glam_train" / item / "checkpoint.pt"
    start = time.perf_counter()
    rows = []
    for row in train(agent, lambda: make_env(t.env_id), t.ppo(), history=p.policy.history, seed=seed,
                     checkpoint=checkpoint if accelerator is None else None, identity=identity,
                     accelerator=accelerator):
        rows.append(row)
        if accelerator is not None and not accelerator.is_main_process:
            continue
        log.info("update %d%s: success %.3f entropy %.3f loss %.4f fps %.2f", row["iteration"],
                 " (restored)" if row.get("resumed") else "", row["success_rate"], row["entropy"], row["loss"],
                 row["fps"])
    if accelerator is not None and not accelerator.is_main_process:
        return
    save_agent(agent, out.model,
               {"build": build, "history": p.policy.history, "env_id": t.env_id, "updates": t.updates})
    # Curves are logged from the full history, so a resumed run draws the same plot as an uninterrupted one.
    with open_live(out.live) as live:
        for row in rows:
            live.step = row["iteration"]
            for k in ("success_rate", "return_mean", "entropy", "policy_loss", "value_loss", "approx_kl"):
                live.log_metric(k, row[k])
    # Headline figures of the last update in the shared vocabulary; the per-update curves are the dvclive plots.
    last = rows[-1]
    write_json(out.metrics,
               {**{k: round(float(last[k]), 4) for k in ("success_rate", "return_mean", "policy_loss", "value_loss",
                                                         "entropy", "approx_kl")},
                "env_steps": int(last["frames"]), "dtype": agent.llm.dtype_name,
                "seconds": round(time.perf_counter() - start, 1)})
    checkpoint.unlink(missing_ok=True)  # the outputs are written: the restart point has served


if __name__ == "__main__":
    main()
