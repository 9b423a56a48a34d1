"""Runs the commands that tests/test_commands.py collected from the docs, in one process (one import of torch and the
simulators; the test starts two), as after the README's set-up alone: the packages that only requirements-dev.txt
brings cannot be imported, except those a command names with "pip install X" beside it.

    python -m tests.command_runner commands.json results.json   (from the directory the runs go to)

Each command is {"program", "argv", "mode", "extras"}; mode "run" runs it (a trainer's run cut to one batch and a
short evaluation); "smoke" runs a trainer's command on a Gymnasium env that way and validates the others: parses
their flags and checks them as the trainer does before it starts (GPU commands as on a machine with CUDA);
"parse" parses a script's flags, "parse_trainer" a trainer's, "parse_eval" ppo_eval.py's; "snippet" checks a Python
block of the docs (argv: its code and a run it may read). results.json holds, per command, "ok" or the error."""

import argparse
import ast
import builtins
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import re
import runpy
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
import tyro

REPO = Path(__file__).resolve().parent.parent
TRAINERS = ("ppo", "ppo_rnn", "ppo_rgb", "ippo")
EVAL_STEPS = 10  # a smoke run's evaluation: enough steps to render a video, not to finish long episodes


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-r"):
            names.add(canonical(re.split(r"[=<>\[; ]", line)[0]))
    return names


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: set[str]) -> set[str]:
    """The distributions names need, installed here, with their own needs (extras left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [canonical(re.split(r"[=<>\[; (!~]", r)[0]) for r in requires if "extra ==" not in r]
    return seen


def dev_only_modules() -> dict[str, str]:
    """Top-level module -> distribution, for what requirements-dev.txt installs and requirements.txt does not."""
    runtime = closure(requirement_names(REPO / "requirements.txt"))
    dev_only = closure(requirement_names(REPO / "requirements-dev.txt")) - runtime
    return {module: canonical(dists[0]) for module, dists in importlib.metadata.packages_distributions().items()
            if all(canonical(d) in dev_only for d in dists)}


def runtime_only(dev_only: dict[str, str], extras: list[str]):
    """Make the dev-only packages look uninstalled (None in sys.modules: import raises ModuleNotFoundError and
    importlib.util.find_spec finds nothing), save the extras that the command names and what they need. A package
    already imported stays (C extensions cannot be imported twice): the commands with extras come last."""
    allowed = closure({canonical(e) for e in extras})
    if "requirements-dev.txt" in extras:
        allowed = set(dev_only.values())
    for module, dist in dev_only.items():
        if dist in allowed or module in allowed:
            if module in sys.modules and sys.modules[module] is None:
                del sys.modules[module]
        elif module not in sys.modules:
            sys.modules[module] = None


def trainer(program: str):
    name = Path(program).stem
    if recipe_of(program) is not None:  # my_rpo.py: ppo.py with recipes/rpo.patch applied, as docs/recipes.md makes it
        if name not in sys.modules:
            recipes = runpy.run_path(str(REPO / "scripts/recipes.py"))
            copy = Path.cwd() / f"{name}.py"  # the command's own directory
            copy.write_text(recipes["apply"]((REPO / "ppo.py").read_text(), recipe_of(program)))
            spec = importlib.util.spec_from_file_location(name, copy)
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
        return sys.modules[name]
    return importlib.import_module(name if name in TRAINERS or name == "ppo_eval" else "ppo")  # my_idea.py: ppo's copy


def recipe_of(program: str) -> Path | None:
    """The recipe whose copy program is (my_rpo.py: recipes/rpo.patch), or None."""
    recipe = REPO / "recipes" / f"{Path(program).stem.removeprefix('my_')}.patch"
    return recipe if Path(program).name.startswith("my_") and recipe.is_file() else None


def smoke_argv(module, args, argv: list[str]) -> list[str]:
    """The command cut to one batch (after the checkpoint's, on --resume) and a short evaluation after it; a
    population's (--pbt_interval) to two, ranked after the first."""
    done, batches = 0, 1
    if args.resume is not None:
        done = module.load_checkpoint(module.find_resume_checkpoint(args.resume))["global_step"]
    if getattr(args, "pbt_interval", None) is not None:
        argv, batches = [*argv, "--pbt_interval=1", "--pbt_warmup=1"], 2
    return [*argv, f"--total_timesteps={done + batches * args.num_envs * args.num_steps}", "--eval_freq=1",
            f"--num_eval_steps={EVAL_STEPS}"]


class Parsed(Exception):
    pass


def parse_script(program: str, argv: list[str]):
    """A script's own argument parser, stopped once it parsed the flags."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *args, **kwargs):
        parse_args(self, *args, **kwargs)
        raise Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            mock.patch.object(sys, "argv", [program, *argv]):
        try:
            runpy.run_path(str(REPO / program), run_name="__main__")
        except Parsed:
            return
    raise AssertionError("the script did not parse its flags")


def free_names(tree: ast.Module) -> set[str]:
    """The names a block reads at its top level and does not bind; a function's body is a sketch, not run."""
    loaded, bound, todo = set(), set(), list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        todo += ast.iter_child_nodes(node)
    return loaded - bound - set(dir(builtins))


def run_snippet(code: str, run: str):
    """A Python block of the docs compiles; each name it reads and does not bind is a module or given by its comments
    ("# NAME: VALUE"); what it imports exists, and so do the modules' attributes it reads; a block that reads a run
    (runs/RUN) runs on `run`."""
    tree = ast.parse(code)
    given = {name: ast.literal_eval(value) for name, value in re.findall(r"#\s*(\w+): ([^,\s]+)", code)}
    modules = {name: importlib.import_module(name) for name in sorted(free_names(tree) - given.keys())}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update({alias.asname or alias.name: importlib.import_module(alias.name) for alias in node.names})
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                getattr(importlib.import_module(node.module), alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            getattr(modules[node.value.id], node.attr)
    if "runs/RUN" in code:
        exec(compile(code.replace("runs/RUN", run), "<docs>", "exec"), {**modules, **given})


def run_one(command: dict):
    program, argv, mode = command["program"], command["argv"], command["mode"]
    if mode == "parse":
        return parse_script(program, argv)
    if mode == "snippet":
        return run_snippet(*argv)
    module = trainer(program)
    if command["extras"]:  # a trainer imports its optional packages at its start, which their blocking may have failed
        module = importlib.reload(module)
    if mode == "parse_eval":
        return tyro.cli(module.EvalArgs, args=argv, use_underscores=True)
    if module.__name__ != "ppo_eval":
        args = module.parse_args(argv)
        if mode == "parse_trainer":  # a command for the reader's own task module, or torchrun's --resume
            return
        maniskill, time_limit = module.find_env(args.env_id)
        if mode == "smoke" and (command["num_ranks"] > 1 or command["validate_only"] or maniskill):
            # what the trainer checks before it starts, as on a machine with CUDA
            with mock.patch("torch.cuda.is_available", return_value=True):
                return module.validate(args, maniskill, time_limit, command["num_ranks"], command["num_ranks"])
        argv = smoke_argv(module, args, argv)
    status = module.cli(argv)
    if status != 0:
        raise AssertionError(f"exit status {status}")


def main():
    commands = json.loads(Path(sys.argv[1]).read_text())
    sys.path.insert(0, str(REPO))
    dev_only = dev_only_modules()
    torch.set_num_threads(1)
    results = []
    for index, command in enumerate(commands):
        start = time.perf_counter()
        stderr = io.StringIO()
        runtime_only(dev_only, command["extras"])
        directory = Path("." if command.get("here") else f"command{index}")  # a fixture run stays in the runner's
        directory.mkdir(exist_ok=True)
        with contextlib.redirect_stderr(stderr), contextlib.chdir(directory):
            try:
                run_one(command)
                result = "ok"
            except SystemExit as e:  # tyro's and argparse's refusals
                result = f"exit {e.code}: {stderr.getvalue().strip()[-600:]}"
            except BaseException as e:
                trace = traceback.format_exc()[-1500:]
                result = f"{type(e).__name__}: {e}\n{stderr.getvalue().strip()[-600:]}\n{trace}"
        if result == "ok" and "error:" in stderr.getvalue():
            result = stderr.getvalue().strip()[-600:]
        results.append(result)
        print(f"{time.perf_counter() - start:5.1f} s {result.splitlines()[0][:60]:60}  {command['program']} "
              f"{' '.join(command['argv'])[:120]}", file=sys.__stderr__, flush=True)
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
