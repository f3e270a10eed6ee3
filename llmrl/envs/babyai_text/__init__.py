"""BabyAI-Text: BabyAI levels described in sentences, with GLAM's mixed train/test levels and text variants.

The package, from the view to the gym id:

- ``description``: the encoded 7x7 egocentric view as facts (``describe_image``, ``Fact``), in GLAM's order or
  nearest first;
- ``missions``: BabyAI missions parsed into trees (``parse_mission``);
- ``languages``: facts and mission trees as English or French sentences, and the text variants (``VARIANTS``);
- ``levels``: GLAM's mixed train/test level (``MixedLocal``, ``HELD_OUT``) and the levels served (``LEVELS``);
- ``wrapper``: the gym wrapper ``BabyAIText`` and ``make_text_env``;
- ``registration``: the ``BabyAI-Text-*`` ids, registered when this package is imported.
"""

from llmrl.envs.babyai_text.description import AGENT, DOOR_STATES, ORDERS, VIEW, Fact, describe_image
from llmrl.envs.babyai_text.languages import ACTIONS_EN, CHARSET, VARIANTS, English, French
from llmrl.envs.babyai_text.levels import HELD_OUT, LEVELS, TASKS, MixedLocal
from llmrl.envs.babyai_text.missions import Desc, parse_mission
from llmrl.envs.babyai_text.wrapper import BabyAIText, make_text_env

# last, once make_text_env is re-exported here: the registered ids' entry point names it through this package
from llmrl.envs.babyai_text import registration  # noqa: F401  (registers BabyAI-Text-*)

__all__ = [
    "ACTIONS_EN", "AGENT", "CHARSET", "DOOR_STATES", "HELD_OUT", "LEVELS", "ORDERS", "TASKS", "VARIANTS", "VIEW",
    "BabyAIText", "Desc", "English", "Fact", "French", "MixedLocal", "describe_image", "make_text_env",
    "parse_mission",
]
