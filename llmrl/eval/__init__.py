"""One evaluation harness for every policy (``harness``: fixed seeds, rates with confidence intervals; ``batched``:
many episodes in lockstep), seed-level aggregation (``seeds``), intervals (``stats``), the shared headline
vocabulary (``headline``), and each method's result logic in a module of its own.

Import from the module that defines a name: importing this package loads none of them, so a stage depends on the
modules it uses and no other (dvc.yaml's deps are a stage's import closure).
"""

__all__: list[str] = []
