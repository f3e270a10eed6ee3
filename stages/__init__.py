"""The pipeline's stages: one module per DVC stage, each with ``main(argv)``, run as ``python -m stages.<name> <args>``
(dvc.yaml's commands). A stage reads its params section through a typed config (``stages.common.stage_params``),
calls the library and writes where ``stages.paths`` names its outputs.

When Python runs a stage module (``python -m stages.<name>``, ``accelerate launch -m stages.<name>``) it imports this
package first, while ``sys.argv[0]`` is still ``"-m"`` (Python's command line documents it: the module is being
located). That is where the stage's process is prepared (``stages.common.prepare_stage_process``: library caches
under .cache/, CPU kernels pinned), before the stage module imports torch or the HF libraries, which read those
settings once, at import. Importing the package anywhere else (a test, the docs) changes nothing; the worker
processes a stage starts inherit the settings through their environment.
"""

import sys

__all__: list[str] = []

if sys.argv[:1] == ["-m"]:
    from stages.common import prepare_stage_process

    prepare_stage_process()
