"""Policies: the baselines (``baselines``: random, the BabyAI bot) and, per method, LLM policies, teachers and
students.

Import from the module that defines a name: importing this package loads none of them, so a stage depends on the
modules it uses and no other (dvc.yaml's deps are a stage's import closure).
"""

__all__: list[str] = []
