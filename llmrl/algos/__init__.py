"""Update rules, one readable file each.

One interface: an algorithm's ``train(model, where it learns, cfg, *, options)`` is a generator that updates the model
in place and yields one metrics row per update, so a caller logs, checkpoints, measures or stops between updates with
a plain ``for`` loop (and ``list(train(...))`` runs it to the end): ``ppo_llm.train(agent, make_env, cfg)``,
``distilled_ppo.train(agent, envs, cfg)``, ``mappo.train(agent, envs, cfg)``, and LLM_RL's two variants on the same
problems, ``reinforce_kl.train(llm, problems, cfg)`` and ``llm_rl_grpo.train(llm, problems, cfg)`` (options: the
few-shot pairs, a list that records every sample, the restart point). Rows share one vocabulary:

- the counter: ``iteration`` (from 1) for one collection + its update (``distilled_ppo``, ``mappo``, ``ppo_llm``,
  ``reinforce_kl``), ``step`` for one optimiser step (``bc_llm``, ``grpo``, ``kalm_grounding``, ``kalm_offline``) or one
  search iteration (``props_search``, ``blackbox``); ``frames`` counts environment steps;
- the episodes that ended in it: ``episodes``, ``success_rate``, ``return_mean``, ``length_mean``;
- the losses: ``loss``, ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``, ``clipfrac``, ``grad_norm``;
- timing: ``fps``, ``collect_s``, ``update_s``.

``ReinforceKL.train`` (the trainer under ``reinforce_kl.train``) yields ``(row, episodes)``, and ``ppo_llm.train``
first yields the rows of a restored checkpoint, marked ``resumed``; in ProPS's rows
``episodes`` is the episode budget spent so far. GLAM's behaviour cloning (``bc_llm.train_bc``) yields ``step``,
``epoch`` and ``loss`` per optimiser step.
"""

__all__: list[str] = []
