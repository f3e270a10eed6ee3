"""The LLM layer: load any model spec (``load``), score candidate strings (``score``), generate (``generate``), share a
prompt prefix (``prefix``), call remote endpoints through one fault policy (``backends``, ``faults``), serve a
model (``serve``), embed instructions (``embed``), and KALM's grounded model (``grounded``, ``heads``).

Import from the module that defines a name: importing this package loads none of them, so a stage depends on the
modules it uses and no other (dvc.yaml's deps are a stage's import closure).
"""

__all__: list[str] = []
