"""Parameter tiers: a default, a study and a paper profile per method, composed by Hydra from ``conf/``.

The default tier lives in the models: every default of a section's pydantic model in ``llmrl/config/`` is the value
the pipeline's default runs with, as TRL's configs hold theirs, so a library user who builds ``GlamParams()`` in
Python gets what ``dvc repro`` runs and every value is written in one place. ``conf/<method>/default.yaml`` and
``conf/shared.yaml`` are generated from the models (``llmrl.config.profiles.default_profile``); the study and paper
profiles (``conf/<method>/study.yaml``, ``paper.yaml``, and ``conf/props/endpoint.yaml``) are hand-written overrides
on top of the default (``defaults: [default, _self_]``). ``conf/config.yaml`` lists the shared sections and one
profile per method (``kalm: default``). Each profile names itself in its ``tier`` key, so ``dvc exp show`` shows
which tier an experiment ran.

- ``params.yaml``: every method at its default: what ``dvc repro`` and ``make repro`` run. With Hydra enabled in
  ``.dvc/config``, ``dvc exp run`` composes the same file from ``conf/``, so one switch selects a tier:
  ``dvc exp run -S kalm=study`` (or ``-S props=paper``), and single keys still work
  (``dvc exp run -S kalm.eval.seed=20100``).
- ``study/params.yaml`` and ``study/dvc.yaml``: the study pipeline (``make study``): the stages of the methods in
  ``STUDY_STAGES``, taken from ``dvc.yaml`` as they are, run with every method at its study profile and writing
  under ``study/`` (``LLMRL_TIER=study``: ``stages/paths.py`` and ``stages/common.py`` read it). Its metrics and
  plots are git-tracked (``cache: false``; so are the outputs in ``CARRIED``), so a fresh clone holds the study's results and
  ``dvc repro --allow-missing`` (what ``make study`` runs through ``pipelines/reproduce.py``) skips the parts
  already done. ``dvc repro`` of the default pipeline never starts a study stage: they live in another file.

    python -m pipelines.tiers --write   # generate conf/<method>/default.yaml and conf/shared.yaml from the models,
                                        # compose params.yaml and study/params.yaml; generate study/dvc.yaml
    python -m pipelines.tiers --check   # exit 1 when one of them is not what the models, conf/ and dvc.yaml give

Why by hand: DVC composes only ``params.yaml`` and only at ``dvc exp run``, from YAML; the default profiles from
the models, the study's files and the check that the committed files match their sources are not something DVC or
Hydra offer.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
METHODS = ("llm_rl", "glam", "llm4teach", "kalm", "props")
TIERS = ("default", "study", "paper")
STUDY = "study"
# The stages of each method the study runs (with their upstream stages of the same method), and the study's report.
STUDY_STAGES: dict[str, tuple[str, ...]] = {
    "kalm": ("kalm_data", "kalm_ground", "kalm_gate0", "kalm_imagine", "kalm_offline_real", "kalm_offline_imagine",
             "kalm_eval"),
    "props": ("props_search", "props_quadratic", "props_baselines", "props_grpo_part", "props_grpo",
              "props_heldout_tuned", "props_heldout_reference", "props_heldout", "props_transfer",
              "props_repeat_control", "props_eval"),
    "llm_rl": ("llm_rl_data", "llm_rl_train", "llm_rl_eval"),
}

# The study's stage minutes (its longest item, measured at study scale on 2 cores beside one other stage: see
# docs/measurements.md), in place of the default's `meta.minutes`: the flow runs the longest chain of waiting stages
# first. DVC leaves `meta` out of a stage's hash, so a change here re-runs nothing.
STUDY_MINUTES: dict[str, float] = {
    # kalm_ground: one grounding seed per item (~25 min a seed, estimated from the 550-update runs)
    "kalm_data": 1, "kalm_ground": 25, "kalm_gate0": 0.2, "kalm_imagine": 4, "kalm_offline_real": 18,
    "kalm_offline_imagine": 18, "kalm_eval": 10,
    "props_search": 24.5, "props_quadratic": 11, "props_baselines": 12, "props_grpo_part": 16, "props_grpo": 0.5,
    "props_heldout_tuned": 17, "props_heldout_reference": 19, "props_heldout": 0.5, "props_transfer": 21,
    "props_repeat_control": 11,
    "props_eval": 0.5,
    "llm_rl_data": 0.5, "llm_rl_train": 13, "llm_rl_eval": 11,
}


def study_report(method: str) -> str:
    """The stage of ``method``'s study page (``study/reports/<method>/``): one per method, so each method's study
    is reported as soon as its own stages have run (the study is done in parts)."""
    return f"{method}_study_report"

# Under these folders a study output is git-tracked (the results that carry a claim and their curves).
TRACKED = ("metrics/", "plots/")
# Study outputs git-tracked because a later part of the study reads them and no part could rebuild them in its own
# time: without a shared DVC remote the cache does not travel between machines, and ProPS's published GRPO adapters
# (7 MB each) take most of a sitting to train; the held-out test and the transfer read them in the next part. The
# ProPS searches' records (60 kB to 2 MB an item) are what props_eval and props_heldout read: carried, a sitting
# that runs the transfer need not also re-run every control-task search to report it.
CARRIED = ("models/props/grpo/", "data/props/search/", "data/props/baselines", "data/props/quadratic",
           "data/props/transfer/", "data/props/repeat_control/", "data/props/heldout/")
# The default profiles, generated from the models' defaults: the shared sections' file and each method's.
SHARED = ("base_llm", "demos", "eval_baselines", "report")
MODELS = {"shared": "llmrl/config/__init__.py and llmrl/config/report.py", "llm_rl": "llmrl/config/llm_rl.py",
          "glam": "llmrl/config/glam.py", "llm4teach": "llmrl/config/llm4teach.py", "kalm": "llmrl/config/kalm.py",
          "props": "llmrl/config/props.py"}
DEFAULT_HEADER = ("# Generated by `python -m pipelines.tiers --write` from {source} (the models' defaults are the "
                  "default tier); edit the model, not this file.\n")
HEADER = ("# Generated by `python -m pipelines.tiers --write` from {source}; edit {source}, not this file "
          "(tests/test_tiers.py checks it).\n")


def overrides(mapping: dict, prefix: str = "") -> list[str]:
    """``mapping`` as Hydra overrides (``++a.b=value``: set, or added where the profile lacks the key; a list
    replaced whole)."""
    out = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += overrides(value, f"{path}.")
        else:
            out.append(f"++{path}={json.dumps(value)}")
    return out


def compose(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """The parameters ``conf/`` composes with Hydra ``overrides`` (e.g. ``["kalm=study"]``), as plain data."""
    from llmrl.config.profiles import compose as compose_profiles

    return compose_profiles(CONF, overrides)


def tier_overrides(tier: str, methods: tuple[str, ...] = METHODS) -> list[str]:
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: known are {list(TIERS)}")
    return [f"{m}={tier}" for m in methods]


def params_text(overrides: list[str] | tuple[str, ...] = (), conf: Path | None = None) -> str:
    """The parameters ``conf`` (default ``conf/``) composes, as DVC writes them at ``dvc exp run``
    (``dvc.utils.hydra.compose_and_dump``)."""
    from dvc.utils.hydra import compose_and_dump

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        compose_and_dump(out, str(conf or CONF), None, "config", str(ROOT), list(overrides))
        return out.read_text(encoding="utf-8")


def _flow_leaves(node):
    """``node`` for ruamel, a list of plain values written on one line (``seeds: [0, 1, 2]``)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, dict):
        out = CommentedMap()
        for k, v in node.items():
            out[k] = _flow_leaves(v)
        return out
    if isinstance(node, list):
        seq = CommentedSeq(_flow_leaves(v) for v in node)
        if not any(isinstance(v, (dict, list)) for v in node):
            seq.fa.set_flow_style()
        return seq
    return node


def default_profiles() -> dict[str, str]:
    """The generated files of ``conf/`` (path relative to it: text): ``shared.yaml`` and every method's
    ``default.yaml``, the models' defaults (``llmrl.config.profiles.default_profile``)."""
    import io

    from llmrl.config.profiles import default_profile

    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):  # None as `null`, not an empty value
        pass

    Representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    yaml = _yaml()
    yaml.Representer = Representer

    def dump(data: dict) -> str:
        buf = io.StringIO()
        yaml.dump(_flow_leaves(data), buf)
        return buf.getvalue()

    out = {"shared.yaml": "# @package _global_\n" + DEFAULT_HEADER.format(source=MODELS["shared"])
           + dump({name: default_profile(name) for name in SHARED})}
    for method in METHODS:
        out[f"{method}/default.yaml"] = DEFAULT_HEADER.format(source=MODELS[method]) + dump(default_profile(method))
    return out


def _yaml() -> YAML:
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 120
    return yaml


def _out_path(item) -> str:
    return next(iter(item)) if isinstance(item, dict) else str(item)


def _under(path: str, outputs: set[str]) -> str | None:
    """The output that holds ``path`` (itself, or a folder above it), or one that ``path`` holds (a folder
    dependency over a matrix stage's items, e.g. ``models/llm_rl`` over ``models/llm_rl/${item.variant}/...``,
    whose templated path counts by its literal part), if any."""
    folder = path.rstrip("/")
    # a templated dependency (``data/kalm/${item.data}``) by its literal folder: whatever it resolves to there
    template = folder.split("${")[0].rstrip("/") if "${" in folder else None
    for out in outputs:
        literal = out.split("${")[0].rstrip("/")
        if path == out or path.startswith(out.rstrip("/") + "/") or literal == folder \
                or literal.startswith(folder + "/"):
            return out
        # inside a templated output's literal folder: ``models/props/grpo_parts/4`` holds items of
        # ``models/props/grpo_parts/${item.part.n}/${item.seed}``
        if "${" in out and folder.startswith(literal + "/"):
            return out
        if template and (out.startswith(template + "/") or literal == template):
            return out
    return None


def _study_out(item):
    """A study output: the path under study/, and git-tracked when it is a metric, a plot or carried between parts."""
    path = _out_path(item)
    opts = dict(item[path] or {}) if isinstance(item, dict) else {}
    if path.startswith(TRACKED + CARRIED):
        opts["cache"] = False
    new = f"{STUDY}/{path}"
    return {new: opts} if opts else new


def _report_deps(deps: list, stages: dict[str, tuple[str, ...]]) -> list:
    """The study report's inputs: its code, and every result file of a study method twice, the default
    pipeline's and the study's (the page shows them side by side); other methods' results are left out."""
    out = []
    for d in deps:
        path = str(d)
        if not path.startswith(TRACKED):
            out.append(d)
        elif path.split("/")[1] in stages:
            out += [path, f"{STUDY}/{path}"]
    return out


# A run cut into resumable part stages: the matrix stage (its ``part`` values ``{n, of, after}``: the part, the
# chain's length, the previous part's folder; its ``seed`` values the runs), the parameter listing its seeds and the
# study's chain length (each part stays under the 30-minute stage limit: the study's part 1 runs the base model's
# searches, props.grpo.functions.loop_functions, and parts 2-5 train 25 steps each, about 16 min beside another part
# on a slower host; dvc.yaml's 4 parts are the default's, which searches nothing). The study's stage is one item per (part,
# seed) after the same seed's previous part, so a seed's next part never waits for the other seeds' (a matrix value
# cannot name the seed's own folder); its items keep the matrix's names. A stage that reads the last part follows it:
# its dependency, and its command's last argument, the chain's length.
PART_CHAINS: dict[str, tuple[str, int]] = {"props_grpo_part": ("props.grpo.seeds", 5)}


def _rechain(result: dict, name: str, parts: int, seeds: list[int]) -> None:
    """Rebuild chain stage ``name`` in ``result`` (a study dag) as ``parts`` parts for each of ``seeds``."""
    stage = result[name]
    chain = stage.pop("matrix")["part"]
    folder = chain[1]["after"].rsplit("/", 1)[0] if len(chain) > 1 else None
    if folder is None:
        raise ValueError(f"{name}: dvc.yaml's chain needs two parts to name its folder")
    last = f"{folder}/{len(chain)}"
    items = CommentedMap()
    for seed in seeds:
        for n in range(1, parts + 1):
            part = CommentedMap(n=n, of=parts, after=chain[0]["after"] if n == 1 else f"{folder}/{n - 1}/{seed}")
            item = CommentedMap(part=part, seed=seed)
            item.fa.set_flow_style()  # one line an item
            items[f"part{n - 1}-{seed}"] = item  # the name DVC gives the matrix's item
    result[name] = {"foreach": items, "do": stage}
    for other in result.values():
        body = other.get("do", other)
        deps = body.get("deps", [])
        if not any(d == last or d.startswith(last + "/") for d in deps):
            continue
        body["deps"] = [f"{folder}/{parts}" + d[len(last):] if d == last or d.startswith(last + "/") else d
                        for d in deps]
        command, count = body["cmd"].rsplit(" ", 1)
        if count != str(len(chain)):
            raise ValueError(f"{name}: a reader of the last part must end its command with the chain's length "
                             f"{len(chain)}: {body['cmd']!r}")
        body["cmd"] = f"{command} {parts}"


def study_dag(dvc_yaml: dict, stages: dict[str, tuple[str, ...]] = STUDY_STAGES,
              minutes: dict[str, float] = STUDY_MINUTES,
              parts: dict[str, tuple[int, list[int]]] | None = None) -> dict:
    """study/dvc.yaml from the pipeline's dvc.yaml: the listed stages, each run with ``LLMRL_TIER=study`` from
    the repository root (``wdir: ..``), its outputs under study/, its inputs from study/ where a study stage writes
    them (else the default pipeline's, e.g. models/base_llm), its params from study/params.yaml, its
    ``meta.minutes`` from ``minutes``, and each chain of parts (``PART_CHAINS``) as ``parts`` gives its count and
    seeds."""
    names = [n for group in stages.values() for n in group]
    source = dvc_yaml["stages"]
    missing = [n for n in names if n not in source]
    if missing:
        raise KeyError(f"STUDY_STAGES names stages dvc.yaml lacks: {missing}")
    outputs = {_out_path(o) for n in names for kind in ("outs", "metrics", "plots")
               for o in source[n].get("do", source[n]).get(kind, []) or []}
    result = {}
    for name in names:
        stage = copy.deepcopy(source[name])
        body = stage.get("do", stage)  # a foreach stage's body is under `do`
        if name in minutes:
            body["meta"] = {**dict(body.get("meta") or {}), "minutes": minutes[name]}
        if "do" in stage:
            result[name] = {"foreach": stage["foreach"], "do": _study_stage(name, body, outputs, stages)}
        else:
            result[name] = _study_stage(name, body, outputs, stages)
    for name, (count, seeds) in (parts or {}).items():
        if name in result:
            _rechain(result, name, count, seeds)
    for method in stages:
        result[study_report(method)] = _study_stage(study_report(method), copy.deepcopy(source["report"]), outputs,
                                                    {method: stages[method]})
    return {"stages": result}


def _study_stage(name: str, stage: dict, outputs: set[str], stages: dict[str, tuple[str, ...]]) -> dict:
    """One stage (or a foreach stage's body) as the study runs it (``study_dag``)."""
    new = {"wdir": ".."}
    for key, value in stage.items():
        if key == "cmd":
            new["cmd"] = f"LLMRL_TIER={STUDY} {value}" + (f" {_method(name)}" if _method(name) else "")
        elif key == "deps" and _method(name):
            new["deps"] = _report_deps(value, stages)
        elif key == "outs" and _method(name):  # the method's page: study/reports/<method>
            new["outs"] = [f"{STUDY}/{_out_path(o)}/{_method(name)}" for o in value]
        elif key == "deps":
            new["deps"] = [f"{STUDY}/{d}" if _under(str(d), outputs) else d for d in value]
        elif key == "params":
            keys = [p for p in value if isinstance(p, str)]
            files = [p for p in value if not isinstance(p, str)]
            new["params"] = ([{f"{STUDY}/params.yaml": keys}] if keys else []) + files
        elif key in ("outs", "metrics", "plots"):
            new[key] = [_study_out(o) for o in value]
        elif key == "matrix":  # a matrix value naming a study output (a part's previous part) moves with it
            new[key] = _study_values(value, outputs)
        else:
            new[key] = value
    return new


def _study_values(node, outputs: set[str]):
    """``node`` with every string that names a study stage's output (or a folder inside one) moved under study/."""
    if isinstance(node, dict):
        for k, v in node.items():  # in place: the node keeps its comments and layout
            node[k] = _study_values(v, outputs)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            node[i] = _study_values(v, outputs)
    elif isinstance(node, str) and "/" in node and _under(node, outputs):
        return f"{STUDY}/{node}"
    return node


def _lookup(params: dict, key: str):
    """``params``'s value at dotted ``key``."""
    for part in key.split("."):
        params = params[part]
    return params


def _method(name: str) -> str | None:
    """The method whose study page stage ``name`` is, else None."""
    return name.removesuffix("_study_report") if name.endswith("_study_report") else None


def write(check: bool = False) -> list[str]:
    """Write (or with ``check`` compare) the default profiles in conf/, params.yaml, study/params.yaml and
    study/dvc.yaml; returns the files that differ from what their sources give. The parameters are composed from
    conf/ with the default profiles as the models give them, so a check needs no write first."""
    yaml = _yaml()
    dvc_yaml = yaml.load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    import io

    import yaml as pyyaml

    profiles = default_profiles()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "conf"
        shutil.copytree(ROOT / "conf", conf)
        for name, text in profiles.items():
            (conf / name).write_text(text, encoding="utf-8")
        default, study = params_text(conf=conf), params_text(tier_overrides(STUDY), conf=conf)
    study_params = pyyaml.safe_load(study)
    buf = io.StringIO()
    chains = {name: (parts, _lookup(study_params, seeds)) for name, (seeds, parts) in PART_CHAINS.items()}
    yaml.dump(study_dag(dvc_yaml, parts=chains), buf)
    wanted = {ROOT / "conf" / name: text for name, text in profiles.items()}
    wanted |= {  # params.yaml exactly as `dvc exp run` composes it, so an experiment never rewrites it
        ROOT / "params.yaml": default,
        ROOT / STUDY / "params.yaml": HEADER.format(source="conf/ (every method at its study profile)") + study,
        ROOT / STUDY / "dvc.yaml": HEADER.format(source="dvc.yaml and pipelines/tiers.py (STUDY_STAGES)")
        + buf.getvalue(),
    }
    from llmrl.config import ParamsError
    from llmrl.config.profiles import validate_params

    for path in (ROOT / "params.yaml", ROOT / STUDY / "params.yaml"):  # a bad profile fails here, writing nothing
        try:
            validate_params(pyyaml.safe_load(wanted[path]))
        except ParamsError as err:
            raise ParamsError(f"{path.relative_to(ROOT)} as conf/ composes it:\n{err}") from None
    stale = []
    for path, text in wanted.items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != text:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the generated files")
    mode.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    stale = write(check=args.check)
    for path in stale:
        print(f"{path}: {'stale (run python -m pipelines.tiers --write)' if args.check else 'written'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
