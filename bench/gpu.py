"""Benchmark on a lent GPU: GLAM's and LLM_RL's paper profiles (conf/<method>/paper.yaml) for as long as a loan allows.

    python bench/gpu.py [glam] [llm_rl] --minutes 6 [--model SPEC | --shape qwen2.5-0.5b] [--dtype float32]

Each part takes its section of the paper profile unchanged (GLAM: 32 envs x 40 frames per update, 4 epochs,
minibatch 64, full fine-tuning at lr 1e-6 on the mixed train level; LLM_RL: 25 problems x 4 samples per
iteration, 10 lines of <= 64 tokens, full fine-tune at lr 1e-5, beta 0.25, the calculator) except the number of
updates, which is what fits in ``--minutes``, and the model:
- the paper models (Qwen2.5-0.5B, Llama-3.2-1B) and GSM8K come from the hub, which a device machine cannot reach;
  the embedded SmolLM2-135M-Instruct is the default and the generated word problems stand in for GSM8K;
- ``--shape qwen2.5-0.5b`` builds random weights of Qwen2.5-0.5B's shape (24 layers, hidden 896; SmolLM2's
  tokenizer and vocabulary): its throughput and memory are the paper model's, its learning curve means nothing.

Recorded: the device, env steps/s (GLAM, collection + update) or generated tokens/s and samples/s (LLM_RL), the
peak GPU memory torch allocated, and the per-update learning curve. Writes bench/results/gpu_<part>[_<shape>].json
(or under --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import transformers
import yaml

ROOT = Path(__file__).resolve().parents[1]
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")

from llmrl.llm.load import LLM, load_model, load_tokenizer  # noqa: E402

EMBEDDED = "embedded:smollm2-135m-instruct"
# Qwen2.5-0.5B's config.json (hidden, layers, heads, KV heads, MLP width); the vocabulary is SmolLM2's.
SHAPES = {"qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                               intermediate_size=4864, rope_theta=1_000_000.0, tie_word_embeddings=True),
          # a model a CPU runs in seconds: the smoke tests of these scripts
          "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, tie_word_embeddings=True)}


def shape_config(shape: str, tok, max_positions: int = 4096):
    """A Qwen2 config of the named shape with ``tok``'s vocabulary."""
    from transformers import Qwen2Config

    # No pad_token_id in the config: it would zero that token's embedding row, and a chat prompt opening with a
    # zero vector multiplies the gradient through every RMSNorm by 1/sqrt(eps) (inf by layer 5 of 24).
    return Qwen2Config(vocab_size=len(tok), max_position_embeddings=max_positions, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, **SHAPES[shape])


def paper_section(method: str) -> dict:
    from llmrl.config.profiles import compose

    return compose(ROOT / "conf", [f"{method}=paper"])[method]


def build_llm(model: str, shape: str | None, *, trainable: bool, dtype: str | None = None) -> LLM:
    """The embedded/local model (``dtype`` None: the loader's choice, bf16 on a GPU), or random weights of a
    named shape, held as ``load_model`` holds a model: fp32 weights under bf16 autocast when trained, bf16 else."""
    if shape is None:
        return load_model(model, trainable=trainable, dtype=dtype)
    from transformers import Qwen2ForCausalLM

    tok = load_tokenizer(EMBEDDED)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    config = shape_config(shape, tok)
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16
    weights_dt = torch.float32 if trainable else dt
    net = Qwen2ForCausalLM(config).to(device=dev, dtype=weights_dt)
    if weights_dt != dt:
        net.forward = torch.autocast(dev.type, dtype=dt)(net.forward)
    net.train() if trainable else net.eval()
    return LLM(model=net, tokenizer=tok, spec=f"random:{shape}", device=dev, dtype=dt)


def device_record() -> dict:
    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {"device": props.name if props else "cpu", "memory_gib": round(props.total_memory / 2**30, 1) if props else None,
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda, "platform": platform.platform(),
            "cpu_count": os.cpu_count()}


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def bench_glam(args) -> dict:
    from llmrl.agents.llm_policy import LLMActorCritic
    from llmrl.algos.ppo_llm import train
    from llmrl.config.glam import GlamParams
    import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
    from llmrl.envs.make import make_env

    p = GlamParams.model_validate(paper_section("glam"))
    cfg = p.train.ppo()  # the paper's 1,172 updates; the time budget stops it
    variant = "full"
    llm = build_llm(args.model, args.shape, trainable=True, dtype=args.dtype)
    agent = LLMActorCritic(llm, head="score", temperature=p.policy.temperature, length_norm=p.policy.length_norm,
                           seed=1)
    rows: list[dict] = []
    deadline = time.perf_counter() + 60 * args.minutes
    start = time.perf_counter()
    for row in train(agent, lambda: make_env(p.train.env_id), cfg, history=p.policy.history, seed=1, progress=False):
        rows.append({**row, "peak_gib": peak_gib()})
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}), flush=True)
        if time.perf_counter() > deadline:
            break
    wall = time.perf_counter() - start
    frames = rows[-1]["frames"] if rows else 0
    steady = rows[1:] or rows  # the first update pays for CUDA's warm-up
    per_update = cfg.n_envs * cfg.frames_per_env
    return {
        "benchmark": "GLAM PPO at the paper profile (conf/glam/paper.yaml), env steps/s of collection + update",
        "model": llm.spec, "variant": variant, "dtype": str(llm.dtype), "env_id": p.train.env_id,
        "settings": {**cfg.model_dump(), "updates": len(rows), "history": p.policy.history},
        "updates": len(rows), "frames": frames, "wall_s": round(wall, 1),
        "env_steps_per_s": round(per_update * len(steady) / sum(per_update / r["fps"] for r in steady), 2)
        if steady else None,
        "env_steps_per_s_overall": round(frames / wall, 2) if wall else None,
        "collect_s_mean": round(sum(r["collect_s"] for r in steady) / len(steady), 2) if steady else None,
        "peak_gpu_gib": peak_gib(),
        "paper_updates": p.train.updates,
        "curve": [{k: r[k] for k in ("iteration", "frames", "episodes", "success_rate", "return_mean", "entropy",
                                     "policy_loss", "value_loss", "approx_kl", "fps", "collect_s", "peak_gib")}
                  for r in rows],
    }


def bench_llm_rl(args) -> dict:
    from llmrl.agents.math_solver import solve
    from llmrl.algos.reinforce_kl import ReinforceKL
    from llmrl.config.llm_rl import ReinforceTrainParams
    from llmrl.envs.word_problems.generator import generated_splits
    from llmrl.llm.generate import SamplingConfig
    from llmrl.seeding import seed_everything

    sec = paper_section("llm_rl")
    p = ReinforceTrainParams.model_validate(sec["train"])
    # the paper's 20 iterations (and its linear lr schedule over them); the time budget stops it
    p = p.model_copy(update={"common": p.common.model_copy(update={"model": args.model})})
    seed_everything(p.common.seed)
    # the CPU default's generator settings (params.yaml llm_rl.data); validation problems are disjoint from training
    train_split, val = generated_splits(600, args.val_problems, seed=0, two_step_fraction=0.2, max_number=20)
    shots, problems = train_split[: p.common.few_shot], train_split[p.common.few_shot:]
    llm = build_llm(args.model, args.shape, trainable=True)
    greedy = SamplingConfig(max_new_tokens=p.common.answer_tokens, temperature=0.0, seed=1234)

    def val_accuracy() -> dict:
        t0 = time.perf_counter()
        llm.model.eval()
        out = solve(llm, val, shots, greedy, batch_size=sec["eval"]["batch_size"], progress=False)
        llm.model.train()
        return {"val_accuracy": sum(r["correct"] for r in out) / len(out), "val_problems": len(out),
                "val_tokens": sum(r["n_tokens"] for r in out), "val_s": round(time.perf_counter() - t0, 1)}

    before = val_accuracy()
    print("before", before, flush=True)
    algo = ReinforceKL(llm, p, problems, shots)
    rows: list[dict] = []
    deadline = time.perf_counter() + 60 * args.minutes
    start = time.perf_counter()
    for stats, episodes in algo.train():
        tokens = sum(ep.tokens for ep in episodes)
        seconds = stats["collect_s"] + stats["update_s"]
        rows.append({"iteration": stats["iteration"], "average_reward": stats["average_reward"],
                     "answer_rate": stats["answer_rate"], "loss": stats["loss"], "divergence": stats["divergence"],
                     "samples": len(episodes), "tokens": tokens, "collect_s": round(stats["collect_s"], 2),
                     "update_s": round(stats["update_s"], 2), "tokens_per_s": round(tokens / seconds, 1),
                     "samples_per_s": round(len(episodes) / seconds, 3), "peak_gib": peak_gib()})
        print(json.dumps(rows[-1]), flush=True)
        if time.perf_counter() > deadline:
            break
    wall = time.perf_counter() - start
    after = val_accuracy()
    print("after", after, flush=True)
    steady = rows[1:] or rows
    total_s = sum(r["collect_s"] + r["update_s"] for r in steady)
    return {
        "benchmark": "LLM_RL REINFORCE-KL at the paper profile (conf/llm_rl/paper.yaml), generated tokens/s and "
                     "samples/s of collection + update",
        "model": llm.spec, "dtype": str(llm.dtype), "data": "generated word problems (GSM8K needs the hub)",
        "settings": {**p.model_dump(mode="json"), "iterations": len(rows)},
        "iterations": len(rows), "wall_s": round(wall, 1),
        "tokens_per_s": round(sum(r["tokens"] for r in steady) / total_s, 1) if total_s else None,
        "samples_per_s": round(sum(r["samples"] for r in steady) / total_s, 3) if total_s else None,
        "peak_gpu_gib": peak_gib(), "paper_iterations": sec["train"]["common"]["iterations"],
        "validation_before": before, "validation_after": after, "curve": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", help="glam and/or llm_rl (default: both)")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget (the update in flight ends)")
    ap.add_argument("--model", default=EMBEDDED, help="model spec (embedded, local folder)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="random weights of this shape instead")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="GLAM: the model's dtype (default: the loader's, bf16 on a GPU)")
    ap.add_argument("--val-problems", type=int, default=200, help="LLM_RL: held-out problems scored greedily")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a smoke test of this script)")
    args = ap.parse_args()
    args.parts = args.parts or ["glam", "llm_rl"]
    if set(args.parts) - {"glam", "llm_rl"}:
        ap.error(f"parts: glam and/or llm_rl, got {args.parts}")
    if not torch.cuda.is_available() and not args.allow_cpu:
        # `make bench` runs every script: on a machine without a GPU this one has nothing to measure
        print("bench/gpu.py: no CUDA device, skipped (the CPU benchmarks are beside it)")
        return
    from llmrl.files import write_json

    for part in args.parts:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        result = bench_glam(args) if part == "glam" else bench_llm_rl(args)
        result["machine"] = device_record()
        name = (f"gpu_{part}" + (f"_{args.shape.replace('.', '')}" if args.shape else "")
                + (f"_{args.dtype}" if args.dtype else "") + ".json")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json(Path(args.out) / name, result)
        print(f"-> {Path(args.out) / name}")


if __name__ == "__main__":
    main()
