"""Stage demos: BabyAI bot demonstrations, one HDF5 trajectory file per level under data/demos/."""

from llmrl.agents.baselines import BabyAIBotPolicy
from llmrl.config import DemosParams
from llmrl.data.trajectories import TrajectoryWriter
import llmrl.envs.babyai_text  # noqa: F401  (registers the BabyAI-Text-* ids)
from llmrl.envs.make import make_env
from llmrl.eval.harness import evaluate
from llmrl.files import write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.demos().demos
ACTION_NAMES = ["turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done"]


def main(argv: list[str] | None = None) -> None:
    stage_arguments("demos", argv)
    p = stage_params("demos", DemosParams)
    seeds = range(p.seed, p.seed + p.episodes)
    summary = {}
    for env_id in p.envs:
        env = make_env(env_id)
        with TrajectoryWriter(OUT / f"{env_id}.h5") as writer:
            result = evaluate(BabyAIBotPolicy(), env, seeds, mode="greedy", max_steps=p.max_steps,
                              on_episode=writer.append, action_text=lambda a: ACTION_NAMES[int(a)])
        summary[env_id] = result.summary()
        log.info("%s: %d bot episodes, success %.3f", env_id, result.n, summary[env_id]["success_rate"])
        env.close()
    write_json(OUT / "summary.json", summary)


if __name__ == "__main__":
    main()
