"""LLM4Teach's teacher: observation → text → plans (LLM or scripted oracle) → skills → action distribution.

Modules: ``describe`` (observation → text), ``prompts`` (prompt, reply parsing, plan distributions),
``planners`` (oracle and LLM planners), ``policy`` (plans → π_T). The names below are the public surface.

1. ``describe`` turns an observation into a short text ("Agent sees <key>, <door>, holds <nothing>.") plus
   the coordinates of the objects it names (the original ``Mediator.RL2LLM``). ColoredDoorKey colours are
   renamed ``color1``/``color2`` in order of appearance before planning and mapped back afterwards, so one
   cached answer serves every colour pair.
2. ``LLMPlanner`` sends the planner prompt (task description + one worked example + the text) ``n_ask``
   times, parses ``Action: {...}`` out of each reply into a typed ``PlanReply`` (plan / invalid / error),
   and turns the frequencies of the valid plans into probabilities. A reply is a valid plan only if every
   step names a known verb of the task and, where the verb takes one, a known object (``validate_plan``);
   anything else is counted invalid with its reason (the original mediator silently turned such steps into
   "do nothing"). Replies go through the foundation's ``CachedBackend`` (a content-addressed
   ``ReplyCache`` on disk) and every distribution is memoised per text in memory, so a text costs LLM time
   once per cache. When no reply is valid, or the backend reports an LLM fault (``LLM_FAULTS``: HTTP
   errors, timeouts, lost connections), the distribution is the fallback plan ("explore") with the
   failures counted — never a ``None`` plan. Any other exception (a programming error, or an offline cache
   miss ``CacheMissError``) propagates and fails the stage. The model behind the backend is created lazily
   (``llmrl.llm.backends.LazyBackend``): a fully cached or oracle run touches no model. ``plan_texts``
   plans a pass under the stage's fault policy (``llmrl.llm.faults.FaultGuard``): once the failed replies
   exceed its share of the replies the pass plans, or its deadline passes, ``LLMOutageError`` (defined in the
   LLM layer, re-exported here) fails the stage instead of the outage becoming the cached teacher.
3. ``OraclePlanner`` answers the same texts with hand-written rules, to separate planner quality from
   distillation quality. ``ScoringPlanner`` asks no sampled replies: it scores each plan of
   ``admissible_plans(kind, text)`` under the LLM (summed log-prob of the bracketed plan after the answer
   prefix; one prompt whose KV cache the candidates share) and takes the softmax as the distribution; a
   planning stage stores those, and ``TablePlanner`` replays them in training and evaluation. Its controls,
   ``UniformPlanner`` (equal scores) and ``RandomScorePlanner`` (random scores, fixed per text), weigh the same
   candidates without an LLM, so the candidate set's share of a student's gain is measured apart.
4. ``TeacherPolicy`` maps each plan through the scripted skills of ``llmrl.agents.skills`` and returns
   π_T(a|s) = Σ_p P(p|text)·U(skill_p(s))(a), U uniform over the primitives that start an equally short
   path: the expectation of the original's per-step plan sampling, computed exactly instead of sampled.
"""

from llmrl.agents.teacher.describe import (ENV_KIND, OBJECT_NAMES, Scene, TaskKind, canonical_colors, describe,
                                           describe_spread, observation_texts, restore_colors)
from llmrl.agents.teacher.planners import (LLM_FAULTS, LLMOutageError, LLMPlanner, OraclePlanner, Planner,
                                           RandomScorePlanner, ScoringPlanner, TablePlanner, UniformPlanner,
                                           admissible_plans, oracle_plan, plan_texts)
from llmrl.agents.teacher.policy import TeacherPolicy, spread_plan_action
from llmrl.agents.teacher.prompts import (FALLBACK_PLAN, PLAN_VERBS, PROMPTS, PlanDistribution, PlanReply,
                                          canonical_plan, parse_reply, validate_plan)

__all__ = ["ENV_KIND", "FALLBACK_PLAN", "LLM_FAULTS", "OBJECT_NAMES", "PLAN_VERBS", "PROMPTS", "LLMOutageError",
           "LLMPlanner", "OraclePlanner", "PlanDistribution", "PlanReply", "Planner", "RandomScorePlanner", "Scene",
           "ScoringPlanner", "TablePlanner", "TaskKind", "UniformPlanner", "TeacherPolicy", "admissible_plans", "canonical_colors", "canonical_plan",
           "describe", "describe_spread", "observation_texts",
           "oracle_plan", "parse_reply", "plan_texts", "restore_colors", "spread_plan_action", "validate_plan"]
