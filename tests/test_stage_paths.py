"""Output paths are named in one place, stages/paths.py: every out, metric and plot that
dvc.yaml declares lies in one of its folders and is what the stage's function there returns for the stage's
command-line arguments (both ways), and no stage script spells a folder or reaches into a method's folders."""

import ast
import shlex
from pathlib import Path

import pytest
import yaml

from stages import paths

ROOT = Path(__file__).resolve().parents[1]
STAGE_SCRIPTS = sorted(p for p in (ROOT / "stages").glob("*.py") if p.name != "paths.py")
TOP_FOLDERS = {"data", "models", "metrics", "plots", "reports", ".cache"}


def declared_outputs() -> list[tuple[str, str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    found = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for key in ("outs", "metrics", "plots"):
            for entry in body.get(key) or []:
                found.append((name, next(iter(entry)) if isinstance(entry, dict) else entry))
    return found


def allowed_prefixes() -> list[str]:
    folders = [getattr(f, kind) for f in paths.FOLDERS for kind in paths.KINDS]
    return [p.relative_to(paths.ROOT).as_posix() for p in (*folders, *paths.SHARED.values())]


@pytest.mark.parametrize("stage,path", declared_outputs(), ids=lambda x: str(x))
def test_every_declared_output_lies_in_a_folder_of_paths_py(stage, path):
    assert any(path == p or path.startswith(p + "/") for p in allowed_prefixes()), (
        f"{stage}: {path} is not under a folder named in stages/paths.py")


@pytest.mark.parametrize("script", STAGE_SCRIPTS, ids=lambda p: p.stem)
def test_no_stage_script_spells_a_top_level_folder(script):
    # a folder joined onto a path (`ROOT / "metrics"`) or spelled as one string ("metrics/glam/...")
    tree = ast.parse(script.read_text())
    joined = {n.right.value for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
              and isinstance(n.right, ast.Constant) and n.right.value in TOP_FOLDERS}
    strings = {n.value.split("/", 1)[0] for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and "/" in n.value and n.value.split("/", 1)[0] in TOP_FOLDERS}
    spelled = joined | strings
    assert not spelled, f"{script.name} names {sorted(spelled)}: take the folder from stages/paths.py"


def test_method_folders_carry_the_params_section_names():
    sections = yaml.safe_load((ROOT / "params.yaml").read_text())
    for folders in (paths.GLAM, paths.LLM_RL, paths.LLM4TEACH, paths.KALM, paths.PROPS):
        assert folders.name in sections, folders.name


def resolved_stages():
    """Every stage of dvc.yaml with its foreach items expanded, as DVC resolves them. (study/dvc.yaml is generated
    from these, its outputs moved under study/: tests/test_tiers.py.)"""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        return [(s.addressing, s.cmd, [o.def_path for o in s.outs]) for s in repo.index.stages
                if Path(s.dvcfile.path) == ROOT / "dvc.yaml"]


STAGES = resolved_stages()


def test_every_stage_of_dvc_yaml_is_resolved():
    assert len(STAGES) >= 40 and any("@" in name for name, _, _ in STAGES)


@pytest.mark.parametrize("name,cmd,declared", STAGES, ids=[s[0] for s in STAGES])
def test_dvc_yaml_declares_what_paths_py_names(name, cmd, declared):
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", f"stages.{name.split('@')[0]}"], cmd
    outputs = getattr(paths, name.split("@")[0])(*argv[3:])
    assert outputs.stage == name
    named = {role: p.relative_to(paths.ROOT).as_posix() for role, p in outputs.items()}

    def under(path, folder):  # a dvclive folder's plots are declared by their path inside it
        return path == folder or path.startswith(folder + "/")

    for path in declared:
        assert any(under(path, p) for p in named.values()), f"{name}: dvc.yaml declares {path}, paths.py does not"
    for role, p in named.items():
        assert any(under(path, p) for path in declared), f"{name}: paths.py names {role}={p}, dvc.yaml does not"


def test_outputs_name_their_stage_in_errors():
    with pytest.raises(AttributeError, match="glam_bc has no output 'modle'"):
        paths.glam_bc().modle


@pytest.mark.parametrize("script", STAGE_SCRIPTS, ids=lambda p: p.stem)
def test_no_stage_script_reaches_into_method_folders(script):
    # paths.GLAM.metrics / "eval" in a script would name an output outside its stage's function
    folder_names = {"GLAM", "LLM_RL", "LLM4TEACH", "KALM", "PROPS", "BASELINES", "SHARED", "Folders", "FOLDERS"}
    tree = ast.parse(script.read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "paths" and n.attr in folder_names}
    used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "stages.paths"
             for a in n.names if a.name in folder_names}
    assert not used, f"{script.name} uses {sorted(used)}: ask the writing stage's function in stages/paths.py"


# Records written by scripts outside the pipeline, on purpose (named in params, documented there).
SCRIPT_RECORDS = {"metrics/llm4teach/selection.json"}  # scripts/llm4teach_select.py


def test_every_tracked_result_file_is_a_declared_output():
    """A git-tracked file under metrics/ or plots/ that no stage declares is never refreshed by a stage run in a
    worker clone (only declared outputs come back to the workspace), so its committed copy goes stale silently."""
    import subprocess

    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:  # DVC's own index: matrix items resolved
        outs = [Path(out.fs_path).relative_to(ROOT).as_posix() for stage in repo.index.stages for out in stage.outs]
    tracked = subprocess.run(["git", "ls-files", "metrics", "plots"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked
    stray = [f for f in tracked if Path(f).name != ".gitignore" and f not in SCRIPT_RECORDS
             and not any(f == out or f.startswith(out + "/") for out in outs)]
    assert not stray, f"tracked in git but no stage's output (add it to the stage or to .gitignore): {stray}"


def test_no_cached_output_is_tracked_in_git():
    """DVC refuses to run a stage whose cached output git tracks ("already tracked by SCM"): a result file committed
    by hand must be a ``cache: false`` output, or leave git."""
    import subprocess

    from dvc.repo import Repo

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    with Repo(str(ROOT)) as repo:
        cached = [Path(out.fs_path).relative_to(ROOT).as_posix() for stage in repo.index.stages
                  for out in stage.outs if out.use_cache]
    both = [f for f in tracked if any(f == out or f.startswith(out + "/") for out in cached)]
    assert not both, f"cached DVC outputs that git also tracks: {both}"


def test_every_cached_output_is_ignored_by_git():
    """A cached output git does not ignore shows up in `git status` after a run and goes into the next
    `git add -A`. DVC writes the .gitignore entry when it runs a stage here, not when the stage's result is taken
    from a worker clone by checkout, so the entries are committed with the stage."""
    import subprocess

    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        cached = sorted({Path(out.fs_path).relative_to(ROOT).as_posix() for stage in repo.index.stages
                         for out in stage.outs if out.use_cache})
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *cached], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert sorted(set(cached) - set(ignored)) == []
    # and the reverse: a git-tracked output (cache: false) that git ignores never reaches a worker clone
    with Repo(str(ROOT)) as repo:
        tracked = sorted({Path(out.fs_path).relative_to(ROOT).as_posix() for stage in repo.index.stages
                          for out in stage.outs if not out.use_cache})
    wrongly = subprocess.run(["git", "check-ignore", "--no-index", *tracked], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert wrongly == [], f"cache: false outputs that git ignores: {wrongly}"


def test_dvclive_summaries_no_stage_declares_are_outside_dvc_hashes():
    """dvclive writes ``<dir>/metrics.json`` beside a stage's declared curves; where ``<dir>`` lies in a folder
    another stage depends on (the report reads plots/glam/train), the file exists only in the workspace that ran
    the training, and the folder's hash would differ from the one its run-cache entry records."""
    from dvc.repo import Repo

    lines = (ROOT / ".gitignore").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# dvclive's summaries"))
    summaries = []
    for line in lines[start:]:
        if not line.strip():
            break
        if not line.startswith("#"):
            summaries.append(line.lstrip("/").replace("*", "lora-0"))
    assert "plots/glam/train/lora-0/metrics.json" in summaries
    with Repo(str(ROOT)) as repo:
        kept = [s for s in summaries if not repo.dvcignore.is_ignored_file(str(ROOT / s))]
        assert not kept, f"add to .dvcignore: {kept}"
        assert not repo.dvcignore.is_ignored_file(str(ROOT / "plots/glam/train/lora-0/plots/metrics/entropy.tsv"))


def test_llm_rl_train_items_follow_the_training_seeds_in_params(tmp_path):
    """llm_rl_train is a matrix over the variants and ``llm_rl.train.seeds``, resolved by DVC from params: three
    seeds give six items, each with the seed in its command and its own outputs where stages/paths.py names them;
    llm_rl_eval depends on the folder that holds every item's model."""
    import shutil

    from dvc.repo import Repo

    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["llm_rl"]["train"]["seeds"] = [0, 1, 2]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    Repo.init(str(tmp_path), no_scm=True)
    with Repo(str(tmp_path)) as repo:
        stages = {s.name: s for s in repo.index.stages}
    items = sorted(name for name in stages if name.startswith("llm_rl_train@"))
    assert items == [f"llm_rl_train@{v}-{s}" for v in ("grpo", "reinforce_kl") for s in (0, 1, 2)]
    for name in items:
        variant, seed = name.removeprefix("llm_rl_train@").rsplit("-", 1)
        assert stages[name].cmd == f"python -m stages.llm_rl_train {variant} {seed}"
        outs = {o.def_path for o in stages[name].outs}
        named = {p.relative_to(paths.ROOT).as_posix() for p in paths.llm_rl_train(variant, seed).values()}
        assert {o.split("/plots/metrics")[0] for o in outs} == named
    assert "models/llm_rl" in {d.def_path for d in stages["llm_rl_eval"].deps}


@pytest.mark.parametrize("tier", ["default", "study"])
def test_props_grpo_parts_chain_each_part_to_the_previous_and_the_last_is_published(tier):
    """Each seed's parts 1..N, each after the previous one (the study's after the same seed's), each told N; the
    items carry the names stages/paths.py gives them; props_grpo reads the seed's last part and is told N."""
    where = ROOT if tier == "default" else ROOT / "study"
    stage = yaml.safe_load((where / "dvc.yaml").read_text())["stages"]
    seeds = yaml.safe_load((where / "params.yaml").read_text())["props"]["grpo"]["seeds"]
    folder = "models/props/grpo_parts" if tier == "default" else "study/models/props/grpo_parts"
    if tier == "default":  # a matrix: a part waits for every seed's previous part (the default trains one seed)
        parts = stage["props_grpo_part"]["matrix"]["part"]
        items = {paths.props_grpo_part(p["n"], p["of"], s).stage.split("@")[1]: (p["n"], p["of"], s, p["after"])
                 for p in parts for s in seeds}
        after = {n: f"{folder}/{n - 1}" for n in range(2, len(parts) + 1)}
    else:
        items = {k: (v["part"]["n"], v["part"]["of"], v["seed"], v["part"]["after"])
                 for k, v in stage["props_grpo_part"]["foreach"].items()}
        assert all(paths.props_grpo_part(n, of, s).stage == f"props_grpo_part@{k}" for k, (n, of, s, _) in items.items())
        after = None
    count = max(n for n, *_ in items.values())
    assert {of for _, of, _, _ in items.values()} == {count}
    assert sorted((n, s) for n, _, s, _ in items.values()) == sorted((n, s) for n in range(1, count + 1) for s in seeds)
    for n, _, s, prev in items.values():
        assert prev == ("models/base_llm" if n == 1 else (after[n] if after else f"{folder}/{n - 1}/{s}"))
    reader = stage["props_grpo"]["do"]
    assert [d for d in reader["deps"] if d.startswith(folder)] == [f"{folder}/{count}/${{item}}"]
    assert reader["cmd"].endswith(f" {count}")


def test_every_props_profile_has_a_step_for_each_default_part():
    """`dvc exp run -S props=<profile>` runs the default pipeline's parts: each needs at least one step."""
    from pipelines.tiers import compose

    parts = len(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["props_grpo_part"]["matrix"]["part"])
    for profile in ("default", "study", "paper", "endpoint"):
        steps = compose([f"props={profile}"])["props"]["grpo"]["trainer"]["max_steps"]
        assert steps is not None and steps >= parts, (profile, steps)


@pytest.mark.parametrize("pipeline", ["dvc.yaml", "study/dvc.yaml"])
def test_dvc_lock_holds_only_live_stage_items(pipeline):
    """A lock entry whose stage item left the pipeline (a renamed stage, a dropped foreach item) is stale state
    that `dvc repro` never removes: it would be read as a result of the current pipeline."""
    from dvc.repo import Repo

    dvcfile = ROOT / pipeline
    with Repo(str(ROOT)) as repo:
        live = {s.addressing.split(":")[-1] for s in repo.index.stages if Path(s.dvcfile.path) == dvcfile}
    locked = set(yaml.safe_load(dvcfile.with_suffix(".lock").read_text())["stages"])
    assert sorted(locked - live) == []
