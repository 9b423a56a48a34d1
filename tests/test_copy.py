"""A copy of a trainer with a changed network (cp ppo.py my_ppo.py) is a trainer of its own: its runs carry its
name, it resumes them exactly, the original refuses them, and ppo_eval.py evaluates them with the copy's code."""

import os
from pathlib import Path

import pytest
import torch

import ippo
import ppo
import ppo_rgb
import ppo_rnn
from tests.test_reliability import ENV, FLAGS
from tests.util import REPO, fast_args, load, refused_in_one_line, run_script, snapshot

TRAINERS = {"ppo": ppo, "ppo_rnn": ppo_rnn, "ippo": ippo, "ppo_rgb": ppo_rgb}
# Each copy's network has a parameter that the original's has not: a LayerNorm after a hidden layer; ippo.py, whose
# parameters are stacked per agent, gets a second linear layer of each hidden width instead.
CHANGED_NETWORK = {
    "ppo": ("layers += [layer_init(nn.Linear(width, size)), ACTIVATIONS[activation]()]",
            "layers += [layer_init(nn.Linear(width, size)), nn.LayerNorm(size), ACTIVATIONS[activation]()]",
            "actor.1.weight"),
    "ppo_rnn": ("layer_init(nn.Linear(hidden_size, hidden_size)), ACTIVATIONS[activation]())",
                "layer_init(nn.Linear(hidden_size, hidden_size)), nn.LayerNorm(hidden_size), "
                "ACTIVATIONS[activation]())",
                "actor_core.encoder.3.weight"),
    "ppo_rgb": ("layers += [layer_init(nn.Linear(width, size)), ACTIVATIONS[activation]()]",
                "layers += [layer_init(nn.Linear(width, size)), nn.LayerNorm(size), ACTIVATIONS[activation]()]",
                "actor.1.weight"),
    "ippo": ("layers += [AgentLinear(num_nets, width, size), ACTIVATIONS[activation]()]",
             "layers += [AgentLinear(num_nets, width, size), AgentLinear(num_nets, size, size), "
             "ACTIVATIONS[activation]()]",
             "actor.1.weight"),
}


def make_copy(trainer: str, folder: Path) -> Path:
    original, changed, _ = CHANGED_NETWORK[trainer]
    source = (REPO / f"{trainer}.py").read_text()
    assert source.count(original) == 1
    folder.mkdir(exist_ok=True)
    copy = folder / f"my_{trainer}.py"
    copy.write_text(source.replace(original, changed))
    return copy


def run_copy(copy: Path, argv: list[str], cwd: Path):
    result = run_script(str(copy), argv, cwd)  # an absolute script path: run_script joins it to nothing
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_copy_trains_resumes_and_evaluates_as_itself(tmp_path, trainer, capfd):
    copy = make_copy(trainer, tmp_path)
    name = copy.stem
    argv = fast_args(ENV[trainer], None, total_timesteps=32 * 2, **FLAGS[trainer])
    run_copy(copy, argv, tmp_path)
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith(f"{ENV[trainer].replace(':', '_')}__{name}__1__")
    ckpt = load(run / "final_ckpt.pt")
    assert ckpt["trainer"] == name and ckpt["iteration"] == 2
    assert CHANGED_NETWORK[trainer][2] in ckpt["model"]

    # The original file neither continues the copy's run nor starts from its weights, and leaves the run as it was.
    before = snapshot(run)
    module = TRAINERS[trainer]
    for refused_argv in (["--resume", str(run)], argv + ["--checkpoint", str(run / "final_ckpt.pt")]):
        line = refused_in_one_line(module, refused_argv, tmp_path, capfd, whole_process=False)
        assert f"written by {name}.py, not {trainer}.py" in line, line
    assert snapshot(run) == before and len(list((tmp_path / "runs").iterdir())) == 1

    # The copy continues its run exactly as an uninterrupted run of the copy.
    run_copy(copy, ["--resume", str(run), "--total_timesteps", str(32 * 4)], tmp_path)
    run_copy(copy, fast_args(ENV[trainer], "whole", total_timesteps=32 * 4, **FLAGS[trainer]), tmp_path)
    resumed, whole = load(run / "final_ckpt.pt"), load(tmp_path / "runs/whole/final_ckpt.pt")
    assert resumed["iteration"] == whole["iteration"] == 4
    for key in whole["model"]:
        assert torch.equal(resumed["model"][key], whole["model"][key]), key

    # ppo_eval.py finds the copy in the working directory, or where --trainer says; not elsewhere.
    evaluated = run_script("ppo_eval.py", [str(run), "--num_episodes", "2", "--num_envs", "1"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"({name}.py," in evaluated.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = run_script("ppo_eval.py", [str(run)], elsewhere)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"written by {name}.py, which is neither beside ppo_eval.py nor in the working directory" in refused.stderr
    named = run_script("ppo_eval.py", [str(run), "--num_episodes", "2", "--num_envs", "1", "--trainer", str(copy)],
                       elsewhere)
    assert named.returncode == 0, named.stderr[-3000:]
    assert named.stdout.splitlines()[2:] == evaluated.stdout.splitlines()[2:]  # the table; line 2 has the time

    # A checkpoint whose tensors do not fit the network of the trainer it names: one error line.
    ckpt["trainer"] = trainer
    torch.save(ckpt, tmp_path / "renamed.pt")
    mismatch = run_script("ppo_eval.py", [str(tmp_path / "renamed.pt")], tmp_path)
    errors = [line for line in mismatch.stderr.splitlines() if line.startswith("error:")]
    assert mismatch.returncode == 2 and len(errors) == 1 and "Traceback" not in mismatch.stderr, mismatch.stderr
    assert f"do not fit {trainer}.py's network" in errors[0]
    saved = tmp_path / "saved"
    saved.mkdir()
    os.replace(tmp_path / "renamed.pt", saved / "ckpt_2.pt")
    before = snapshot(tmp_path)
    for refused_argv in (argv + ["--checkpoint", str(saved / "ckpt_2.pt")],
                         ["--resume", str(saved), "--total_timesteps", str(32 * 8)]):
        line = refused_in_one_line(module, refused_argv, tmp_path, capfd, whole_process=False)
        assert f"do not fit {trainer}.py's network" in line, line
    assert snapshot(tmp_path) == before


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_evaluating_a_copy_in_maniskill_cpu_workers(tmp_path):
    """ManiSkill's CPU simulation with 2 envs runs in forkserver workers, which import the copy by its module name:
    ppo_eval.py must make the copy importable there, even when it lies outside the working directory."""
    copy = make_copy("ppo", tmp_path / "ideas")
    run_copy(copy, fast_args("PushCube-v1", "pick", num_envs=1, num_eval_envs=1, num_steps=10, total_timesteps=10,
                             num_minibatches=1, update_epochs=1), tmp_path)
    evaluated = run_script("ppo_eval.py", ["runs/pick", "--trainer", str(copy), "--num_envs", "2",
                                           "--num_episodes", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "(my_ppo.py, PushCube-v1" in evaluated.stdout and "2 episodes on 2 envs" in evaluated.stdout
