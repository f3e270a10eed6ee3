"""Environments, one module per family: ``make`` (``make_env`` over gymnasium ids, seeded and quiet), the BabyAI-Text
levels (``babyai_text``), the DoorKey family (``doorkey``), MPE's simple_spread (``mpe``), the control tasks
(``control``), KALM's goal levels (``kalm_levels``, ``kalm_babyai``, ``metaworld_tasks``, ``kalm_episodes``) and the
math word problems (``word_problems``).

Import from the module that defines a name: importing this package loads none of them, so a stage depends on the
environments it uses and no other (dvc.yaml's deps are a stage's import closure).
"""

__all__: list[str] = []
