"""Stage glam_train@<variant>-<seed>: PPO of the LLM policy (GLAM) on a BabyAI-Text level.

Resumable: every update ends with an atomic checkpoint in .cache/resume/glam_train/<item>/ (scratch, not a DVC out:
it only serves a restart, so a pushed and pulled clone has nothing uncached), stored with the run identity (params,
the base model's content, the source of every project module loaded). A restarted stage continues from a checkpoint
of the same run, ending with the metrics of an uninterrupted run; any other checkpoint is discarded with a log line.
The checkpoint is removed once the outputs are written.

Several devices: ``accelerate launch --multi_gpu --num_processes N -m stages.glam_train <item>`` trains with DDP
(without CUDA on CPU over gloo; ``--cpu`` would start one process). Every process collects the same rollouts and
trains on its 1/N share of each minibatch (``llmrl.algos.ppo_llm``); the main process writes the outputs, and such
a run keeps no restart point.
"""

import argparse
import time

import torch

from llmrl.agents.llm_policy import build_agent, save_agent
from llmrl.algos.ppo_llm import train
from llmrl.checkpoint import project_sources, run_identity
from llmrl.config.glam import GlamParams
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.files import write_json
from stages import paths
from stages.common import log, open_live, stage_params
from stages.launch import launched
from stages.paths import RESUME, ROOT


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.glam_train")
    parser.add_argument("item", nargs="?", help="<variant>-<seed> of glam.train.variants x seeds (default: the first)")
    args = parser.parse_args(argv)
    p = stage_params("glam", GlamParams)
    item = args.item or f"{p.train.variants[0]}-{p.train.seeds[0]}"
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
    launch = launched()
    accelerator = launch.accelerator
    agent = build_agent(**build, device=launch.device)
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
        if not launch.is_main:
            continue
        log.info("update %d%s: success %.3f entropy %.3f loss %.4f fps %.2f", row["iteration"],
                 " (restored)" if row.get("resumed") else "", row["success_rate"], row["entropy"], row["loss"],
                 row["fps"])
    if not launch.is_main:
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
