"""Every command the project prints runs: the shell commands of README.md, docs/*.md, benchmarks/README.md and the
docstrings and headers of the trainers, ppo_eval.py, pomdp.py, scripts/ and benchmarks/ and the recipes' text above
their diff, collected from the files (a new example is covered the day it is written) and run as after the README's
set-up alone (a recipe's copy, my_rpo.py, as ppo.py with the recipe applied; tests/command_runner.py hides what only
requirements-dev.txt installs, unless the command says "pip install X"). A command's environment
variables and `timeout` in front of it are dropped. A shell block of the docs is checked whole by bash -n, and its
lines of other shell forms (a for loop, a Slurm script) run in bash with the trainers' launchers stubbed, each
python or torchrun command they launch collected as its line's. A Python block of the docs compiles, the names it
does not define are modules or given in its comments ("# critic_dim: 0"), one that reads a run (runs/RUN) runs
on a fixture run, and one that starts with "# NAME.py" is that file, saved where the commands run. The commands
that benchmarks/results/ records (their "command:" lines, indented and inline ones) are the long runs the results
came from: their flags are validated, not run.

A trainer's command on a Gymnasium env runs cut to one batch and a short evaluation with the command's own flags
(videos included); ManiSkill's commands (each starts worker processes or a GPU simulation), torchrun's and those
that "..." abbreviates are parsed and validated as on a machine with CUDA, and a small ManiSkill CPU run with video
runs as after the runtime set-up; a script's flags are parsed by its own parser; ppo_eval.py's commands evaluate
(or export) small runs; a shell script is checked by bash -n."""

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from tests.command_runner import recipe_of
from tests.util import REPO, script_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks/README.md"]
RESULTS = sorted((REPO / "benchmarks/results").rglob("*.md"))
PYTHON_FILES = [*(REPO / name for name in ("ppo.py", "ppo_rnn.py", "ppo_rgb.py", "ippo.py", "ppo_eval.py", "pomdp.py")),
                *sorted((REPO / "scripts").glob("*.py")), *sorted((REPO / "benchmarks").glob("*.py"))]
SHELL_FILES = [*sorted((REPO / "scripts").glob("*.sh")), *sorted((REPO / "benchmarks").glob("*.sh"))]
RECIPES = sorted((REPO / "recipes").glob("*.patch"))  # their text above the diff
TRAINERS = ("ppo.py", "ppo_rnn.py", "ppo_rgb.py", "ippo.py", "my_idea.py")
COMMAND_START = re.compile(r"^(\$ )?(python|\.venv/bin/python|torchrun|bash|scripts/|benchmarks/|cp |tensorboard|"
                           r"\.venv/bin/tensorboard)\b")
# what may stand before a command: environment variables, and timeout with its options and duration
PREFIX = re.compile(r"^(?:[A-Za-z_]\w*=(?:\"[^\"]*\"|\S*)\s+)*"
                    r"(?:timeout\s+(?:(?:-[sk]\s+\S+|--?[\w-]+(?:=\S+)?)\s+)*\S+\s+)?")
SHELL_BLOCKS = ("bash", "sh", "shell")
# the trainers' launchers, stubbed where a shell block's loops and scripts run: each records its command and the line
# of the block it came from (the bottom of bash's call stack)
TRACE_STUBS = """record() { { printf '%s' "${BASH_LINENO[-2]}"; printf '\\x1f%s' "$@"; printf '\\x1e'; } >> "$TRACE"; }
python() { record python "$@"; }
torchrun() { record torchrun "$@"; }
srun() { "$@"; }
scontrol() { echo node0; }
timeout() { while [[ $1 == -* ]]; do [[ $1 == -[sk] ]] && shift; shift; done; shift; "$@"; }
"""
# What a traced doc line may run besides the stubs: programs that read and print, and change nothing
SAFE_PROGRAMS = ("ls", "head", "tail", "cat", "seq", "nproc", "basename", "dirname", "date", "sort", "wc", "tr")
SLURM_ENV = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node0"}  # what Slurm gives a job
# a command that benchmarks/results/ records: a program of the repository with its arguments, run by python, bash or
# torchrun or alone (a program's name alone is prose)
RESULT_COMMAND = re.compile(r"^(?:(?:python|bash) )?[\w./-]+\.(?:py|sh) \S|^torchrun .*\.py\b")
# Modules that a doc names as the reader's own: a command that imports one is checked for its flags only.
OWN_MODULES = ("my_tasks", "my_package", "my_module")
# The smoke run that the placeholders of run directories and checkpoints stand for, per trainer.
FIXTURE_ENVS = {"ppo.py": ("tests.envs:PointMass-v0", []), "maniskill": ("PushCube-v1", []),
                "ppo_rnn.py": ("tests.envs:PointMass-v0", []), "ppo_rgb.py": ("tests.envs:PointMassPixels-v0", []),
                "ippo.py": ("pz:tests.pz_envs:meet", ["pettingzoo"])}
DEV = "requirements-dev.txt"  # the extras of a command that may use every package of the --dev set-up
MANISKILL_EVAL_FLAGS = {"--save_trajectory", "--sim_backend", "--reconfiguration_freq", "--control_mode"}
FIXTURE_FLAGS = ["--num_envs=1", "--num_eval_envs=1", "--num_steps=8", "--num_minibatches=1", "--total_timesteps=8",
                 "--eval_freq=1", "--num_eval_steps=4", "--sim_backend=cpu"]


@dataclass
class Command:
    where: str  # file:line
    text: str
    comment: str = ""  # its own trailing comment and the comment lines above it in its block
    tokens: list[str] = field(default_factory=list)
    recorded: bool = False  # a command that benchmarks/results/ records: validated, not run
    prefix: str = ""  # the environment variables and timeout before it, dropped


def logical_lines(lines: list[str]):
    """(line number, the first physical line, the line with its backslash continuations joined, stripped)."""
    i = 0
    while i < len(lines):
        number, first, line = i + 1, lines[i], lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        yield number, first, line


@dataclass
class Block:
    where: str  # file:line of its first line
    language: str
    lines: list[str]  # as written, from the line after the fence
    first: int  # the file's line number of lines[0]


def blocks(path: Path) -> list[Block]:
    found, block = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            if block is None:
                block = Block(f"{path.relative_to(REPO)}:{number}", line.strip()[3:].strip(), [], number + 1)
            else:
                found.append(block)
                block = None
        elif block is not None:
            block.lines.append(line)
    return found


def doc_commands(path: Path) -> list[Command]:
    """The commands of the shell blocks, and those that the blocks' lines of other shell forms launch."""
    commands = []
    for block in blocks(path):
        if block.language not in SHELL_BLOCKS:
            continue
        comments, other_forms = [], {}
        for offset, _, line in logical_lines(block.lines):
            number = block.first + offset - 1
            if line.startswith("#"):
                comments.append(line)
            elif COMMAND_START.match(PREFIX.sub("", line)):
                commands.append(command(f"{path.relative_to(REPO)}:{number}", line, comments))
            elif line:
                other_forms[number] = line
            else:
                comments = []
        if other_forms:
            commands += traced(path, other_forms, " ".join(comments))
    return commands


def traced(path: Path, lines: dict[int, str], comment: str) -> list[Command]:
    """The python and torchrun commands that lines of other shell forms (loops, conditions, variables, srun) launch,
    found by running them in bash with the launchers stubbed, in an empty directory with nothing on PATH (any other
    program than SAFE_PROGRAMS that a doc line would start fails the test, rather than running); the first of each
    line's."""
    with tempfile.TemporaryDirectory() as directory:
        script, trace, programs = Path(directory) / "block.sh", Path(directory) / "trace", Path(directory) / "bin"
        programs.mkdir()
        for program in filter(shutil.which, SAFE_PROGRAMS):
            (programs / program).symlink_to(shutil.which(program))
        body = [re.sub(r"(^|[\s;])\.venv/bin/python\b", r"\1python", line) for line in lines.values()]
        script.write_text(TRACE_STUBS + "\n".join(body) + "\n")
        ran = subprocess.run([shutil.which("bash"), str(script)], cwd=directory, capture_output=True, text=True,
                             env={**script_env(), **SLURM_ENV, "TRACE": str(trace), "PATH": str(programs)})
        assert ran.returncode == 0 and not ran.stderr, f"{path.relative_to(REPO)}: {list(lines.values())}\n{ran.stderr}"
        records = trace.read_text().split("\x1e")[:-1] if trace.exists() else []
    numbers, commands = list(lines), {}
    for record in records:
        line, *argv = record.split("\x1f")
        number = numbers[int(line) - TRACE_STUBS.count("\n") - 1]
        where, comments = f"{path.relative_to(REPO)}:{number}", [comment, lines[number].partition(" # ")[2]]
        commands.setdefault(number, command(where, shlex.join(argv), comments))
    return list(commands.values())


@dataclass
class Snippet:
    where: str
    text: str


def python_blocks(path: Path) -> list[Snippet]:
    return [Snippet(block.where, textwrap.dedent("\n".join(block.lines))) for block in blocks(path)
            if block.language == "python"]


def results_commands(path: Path) -> list[Command]:
    """What a results file says ran: its "command:" lines (a placeholder seed as 1, a variant's flags and what follows
    ", i.e." or "; " left out), its indented lines and its inline code that run a program of the repository."""
    where = path.relative_to(REPO)
    text, found = path.read_text(), []
    for number, line in enumerate(text.splitlines(), 1):
        match = re.search(r"(?:^|; )command: (.*)", line)
        if match:
            recorded = re.split(r", i\.e\.|; ", match.group(1))[0]
            recorded = re.sub(r"\[variant flags?\]", "", re.sub(r"\bSEED\b|<seed>", "1", recorded))
            found.append((number, recorded))
    indented = [line[4:] if line.startswith("    ") else "" for line in text.splitlines()]
    found += [(number, line) for number, _, line in logical_lines(indented) if line]
    found += [(text.count("\n", 0, span.start()) + 1, " ".join(span.group(1).split()))
              for span in re.finditer(r"`([^`]+)`", text)]
    commands = []
    for number, line in found:
        prefix = PREFIX.match(line).group()
        if RESULT_COMMAND.match(line[len(prefix):]):
            program = line[len(prefix):].split()[0]
            runner = "python " if program.endswith(".py") else "bash " if program.endswith(".sh") else ""
            commands.append(command(f"{where}:{number}", prefix + runner + line[len(prefix):], [], recorded=True))
    return commands


def docstring_commands(path: Path) -> list[Command]:
    if path.suffix == ".py":
        text = ast.get_docstring(ast.parse(path.read_text())) or ""
    elif path.suffix == ".patch":
        text = path.read_text().split("\ndiff --git")[0]
    else:  # a shell script's header: its first comment lines
        header = []
        for line in path.read_text().splitlines()[1:]:
            if not line.startswith("#"):
                break
            header.append(line[2:])  # "# " off: a command stands indented after it
        text = "\n".join(header)
    # commands stand indented; a line of prose that names one does not
    return [command(f"{path.relative_to(REPO)}:docstring {number}", line, [])
            for number, first, line in logical_lines(text.splitlines())
            if first.startswith(" ") and COMMAND_START.match(line)]


def command(where: str, line: str, comments: list[str], recorded: bool = False) -> Command:
    text, _, comment = re.sub(r"^\$ ", "", line).partition(" # ")  # a comment starts at " # "
    if text.lstrip().startswith("#"):
        text, comment = "", text
    prefix = PREFIX.match(text).group()
    return Command(where, text[len(prefix):].strip(), " ".join([*comments, comment]), recorded=recorded,
                   prefix=prefix.strip())


def collect() -> list[Command]:
    commands = [c for path in DOCS for c in doc_commands(path)]
    commands += [c for path in PYTHON_FILES + SHELL_FILES + RECIPES for c in docstring_commands(path)]
    commands += [c for path in RESULTS for c in results_commands(path)]
    for c in commands:
        c.tokens = ["python" if t == ".venv/bin/python" else t for t in shlex.split(c.text) if t != "..."]
    return commands


def extras(c: Command) -> list[str]:
    """The packages a command says it needs: "pip install X Y" beside it."""
    return [name for group in re.findall(r"pip install ((?:[\w.\[\]-]+ ?)+)", c.comment) for name in group.split()]


def names_own_module(argv: list[str]) -> bool:
    return any(part.split(".")[0] in OWN_MODULES for token in argv for part in re.split("[=:]", token))


def plan(c: Command, fixtures: dict[str, str]) -> dict | None:
    """What the runner does with the command, or None where it is checked here (shell, cp, pytest, tensorboard).
    scripts/sweep.sh's command: the trainer's command after its "--"."""
    tokens = c.tokens
    if tokens[0].endswith("sweep.sh"):  # the first run of the sweep
        options = tokens[:tokens.index("--")]
        first_values = [options[i + 1].split()[0] for i, t in enumerate(options) if t == "--vary"]
        first_seed = options[options.index("--seeds") + 1].split()[0]
        tokens = tokens[tokens.index("--") + 1:] + [*first_values, f"--seed={first_seed}"]
    if tokens[0] == "torchrun":
        script = next(i for i, t in enumerate(tokens) if t.endswith(".py"))
        ranks = 1
        for flag in ("--nnodes", "--nproc_per_node"):
            ranks *= next((int(t.split("=")[1]) for t in tokens[:script] if t.startswith(flag + "=")), 1)
        return trainer_plan(c, tokens[script], tokens[script + 1:], fixtures, num_ranks=ranks)
    if tokens[0] != "python" or len(tokens) < 2 or tokens[1] == "-m":
        return None
    program, argv = tokens[1], tokens[2:]
    if program in TRAINERS or recipe_of(program) is not None:
        return trainer_plan(c, program, argv, fixtures)
    if program == "ppo_eval.py" and c.recorded:
        return dict(program=program, argv=argv, mode="parse_eval", extras=[DEV])
    if program == "ppo_eval.py":
        return eval_plan(c, argv, fixtures)
    # scripts/ and benchmarks/ are the developers' tools: they run after the --dev set-up
    return dict(program=program, argv=argv, mode="parse", extras=[DEV])


def trainer_plan(c: Command, program: str, argv: list[str], fixtures: dict[str, str], num_ranks: int = 1) -> dict:
    argv = list(argv)
    if "--resume" in argv:
        fixture = program if program in fixtures else "ppo.py"
        argv[argv.index("--resume") + 1] = fixtures[fixture]
        # under torchrun: parsed, which reads the checkpoint and checks what may change on --resume
        return dict(program=program, argv=argv, mode="run" if num_ranks == 1 else "parse_trainer",
                    extras=[*extras(c), *FIXTURE_ENVS[fixture][1]])
    for i, token in enumerate(argv):
        if token == "--checkpoint":
            argv[i + 1] = fixtures["ppo.py"] + "/final_ckpt.pt"
    # the runner runs it unless it is a ManiSkill command, one that "..." abbreviates or one that benchmarks/results/
    # records (a long run, with the developers' packages): those it validates
    return dict(program=program, argv=argv, mode="parse_trainer" if names_own_module(argv) else "smoke",
                extras=[DEV] if c.recorded else extras(c), num_ranks=num_ranks,
                validate_only=c.recorded or "..." in c.text.split())


def eval_plan(c: Command, argv: list[str], fixtures: dict[str, str]) -> dict:
    fixture = fixtures["maniskill" if set(argv) & MANISKILL_EVAL_FLAGS else "ppo.py"]
    argv = [fixture if t.startswith("runs/") else t for t in argv]
    for i, token in enumerate(argv):
        if token == "--trainer":
            argv[i + 1] = str(REPO / "ppo.py")
        if token in ("--num_episodes", "--num_envs"):
            argv[i + 1] = str(min(int(argv[i + 1]), 2))
        if token == "--max_episode_steps":
            argv[i + 1] = "10"
    if "--num_episodes" not in argv:
        argv += ["--num_episodes", "2"]
    return dict(program="ppo_eval.py", argv=argv, mode="parse_eval" if names_own_module(argv) else "run",
                extras=extras(c))


def test_every_command_the_project_prints_runs(tmp_path):
    commands = collect()
    # the collector still finds the docs' commands, those of their loops and Slurm script, those with environment
    # variables or timeout before them, and those that benchmarks/results/ records
    assert len(commands) > 80, [c.text for c in commands]
    traced_texts = ("--seed=1 --exp_name=push_s1", "--nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_id=1")
    assert [any(part in c.text for c in commands) for part in traced_texts] == [True, True], [c.text for c in commands]
    assert len([c for c in commands if c.prefix]) >= 2, [c.text for c in commands]
    assert len([c for c in commands if c.recorded]) >= 20, [c.text for c in commands]
    snippets = [s for path in DOCS for s in python_blocks(path)]
    assert len(snippets) >= 2 and any("runs/RUN" in s.text for s in snippets), snippets
    shell_blocks = [b for path in DOCS for b in blocks(path) if b.language in SHELL_BLOCKS]
    assert len(shell_blocks) > 20, [b.where for b in shell_blocks]
    # each command runs in a directory of its own (two runs started in one second would share a default name); the
    # fixtures in their runner's
    fixtures = {name: str(tmp_path / "runner0/runs" / f"fixture_{Path(name).stem}") for name in FIXTURE_ENVS}
    planned, failures = [], []
    for name, (env_id, needs) in FIXTURE_ENVS.items():
        argv = ["--env_id", env_id, "--exp_name", Path(fixtures[name]).name, *FIXTURE_FLAGS,
                *([] if name == "maniskill" else ["--no_capture_video"])]
        planned.append((None, dict(program="ppo.py" if name == "maniskill" else name, mode="run", extras=needs,
                                   here=True, argv=argv)))
    for c in commands:
        step = plan(c, fixtures)
        if step is None or c.tokens[0].endswith("sweep.sh"):
            failures += check_here(c)
        if step is not None:
            planned.append((c, step))
    for block in shell_blocks:
        checked = subprocess.run(["bash", "-n"], input="\n".join(block.lines), capture_output=True, text=True)
        failures += [f"{block.where}: bash -n\n  {checked.stderr}"] if checked.returncode else []
    for snippet in snippets:  # run on the fixture run of the trainer it names
        named = [f"{name}.py" for name in ("ppo_rnn", "ppo_rgb", "ippo") if f"{name}." in snippet.text]
        trainer = (named or ["ppo.py"])[0]
        planned.append((snippet, dict(program="snippet", argv=[snippet.text, fixtures[trainer]], mode="snippet",
                                      extras=FIXTURE_ENVS[trainer][1])))
    planned.sort(key=lambda step: bool(step[1]["extras"]))  # see command_runner.runtime_only
    # two runners, one per core, each in a directory of its own: the fixtures and what reads them, and every other
    # one of the rest (in order: see command_runner.runtime_only)
    uses_fixture = lambda step: step[0] is None or any("/runs/fixture_" in t for t in step[1]["argv"])  # noqa: E731
    rest = [s for s in planned if not uses_fixture(s)]
    halves = [sorted([s for s in planned if uses_fixture(s)] + rest[1::2], key=lambda s: bool(s[1]["extras"])),
              rest[::2]]
    runners = []
    module_files = {match.group(1): s.text for s in snippets if (match := re.match(r"# (\w+\.py)\n", s.text))}
    assert "my_torch_env.py" in module_files, list(module_files)
    for i, half in enumerate(halves):
        cwd = tmp_path / f"runner{i}"
        cwd.mkdir()
        for name, text in module_files.items():  # a command names it as its env's module
            (cwd / name).write_text(text)
        (cwd / "commands.json").write_text(json.dumps([step for _, step in half]))
        # the commands with --track log offline, as the docs tell a machine without a wandb login to
        runners.append(subprocess.Popen([sys.executable, "-m", "tests.command_runner", "commands.json", "results.json"],
                                        cwd=cwd, env={**script_env(), "WANDB_MODE": "offline"}, stderr=subprocess.PIPE,
                                        text=True))
    outcomes = []
    for runner, i in zip(runners, range(2)):
        _, stderr = runner.communicate(timeout=600)
        print(stderr)  # each command's time and outcome, shown where the test fails
        assert runner.returncode == 0, stderr[-5000:]
        outcomes += json.loads((tmp_path / f"runner{i}" / "results.json").read_text())
    for (c, step), outcome in zip(halves[0] + halves[1], outcomes):
        if outcome != "ok":
            failures.append(f"{c.where if c else 'fixture'}: {c.text if c else step['argv']}\n"
                            f"  ran as: {step['mode']} {step['program']} {' '.join(step['argv'])}\n  {outcome}")
    assert not failures, "\n\n".join(failures)


def check_here(c: Command) -> list[str]:
    tokens = c.tokens
    if tokens[0] == "bash" or tokens[0].endswith(".sh"):  # scripts/sweep.sh's trainer command is planned apart
        script = tokens[1] if tokens[0] == "bash" else tokens[0]
        checked = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
        return [] if checked.returncode == 0 else [f"{c.where}: {c.text}\n  {checked.stderr}"]
    if tokens[0] == "cp":
        return [] if (REPO / tokens[1]).exists() else [f"{c.where}: {c.text}\n  no {tokens[1]}"]
    if tokens[:3] == ["python", "-m", "pytest"]:
        paths = [t.split("::")[0] for t in tokens[3:] if t.startswith("tests")]
        return [f"{c.where}: {c.text}\n  no {p}" for p in paths if not (REPO / p).exists()]
    if "tensorboard" in tokens[0]:
        return []
    return [f"{c.where}: {c.text}\n  the test does not know how to run this command"]
