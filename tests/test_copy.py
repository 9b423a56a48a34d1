"""A copy of a trainer with a changed network (cp ppo.py my_ppo.py) is a trainer of its own: its runs carry its
name, it resumes them exactly, the original refuses them, and ppo_eval.py evaluates them with the copy's code."""

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
import torch

import ippo
import ppo
import ppo_rgb
import ppo_rnn
from tests.test_reliability import ENV, FLAGS
from tests.util import REPO, fast_args, load, refused_in_one_line, run_script, run_scripts, snapshot

# ppo_rnn.py's part in this (main, write_checkpoint, load_checkpoint, load_weights) is checked copies of ppo.py's
TRAINERS = {"ppo": ppo, "ippo": ippo, "ppo_rgb": ppo_rgb}
# Each copy's network has a parameter that the original's has not: a LayerNorm after a hidden layer; ippo.py, whose
# parameters are stacked per agent, gets a second linear layer of each hidden width instead.
CHANGED_NETWORK = {
    "ppo": ("layers += [layer_init(nn.Linear(width, size)), ACTIVATIONS[activation]()]",
            "layers += [layer_init(nn.Linear(width, size)), nn.LayerNorm(size), ACTIVATIONS[activation]()]",
            "actor.1.weight"),
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
    kept = run / "source" / ckpt["source_sha256"][:12] / copy.name  # the run keeps the file that trained it
    assert ckpt["source_sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert kept.read_bytes() == copy.read_bytes()

    # The original file neither continues the copy's run nor starts from its weights, which do not fit its network,
    # and leaves the run as it was.
    before = snapshot(run)
    module = TRAINERS[trainer]
    for refused_argv, says in ((["--resume", str(run)], f"written by {name}.py, not {trainer}.py"),
                               (argv + ["--checkpoint", str(run / "final_ckpt.pt")],
                                f"do not fit {trainer}.py's network")):
        line = refused_in_one_line(module, refused_argv, tmp_path, capfd, whole_process=False)
        assert says in line, line
    assert snapshot(run) == before and len(list((tmp_path / "runs").iterdir())) == 1

    # The copy continues its run exactly as an uninterrupted run of the copy (the two side by side).
    for result in run_scripts([(str(copy), ["--resume", str(run), "--total_timesteps", str(32 * 4)]),
                               (str(copy), fast_args(ENV[trainer], "whole", total_timesteps=32 * 4, **FLAGS[trainer]))],
                              tmp_path):
        assert result.returncode == 0, result.stderr[-3000:]
    resumed, whole = load(run / "final_ckpt.pt"), load(tmp_path / "runs/whole/final_ckpt.pt")
    assert resumed["iteration"] == whole["iteration"] == 4
    for key in whole["model"]:
        assert torch.equal(resumed["model"][key], whole["model"][key]), key

    # ppo_eval.py finds the copy in the working directory, or where --trainer says; not elsewhere; with --run_trainer
    # it takes the file the run kept, while the copy has changed since (the original network: its weights do not fit,
    # and a note says the file differs). And a checkpoint whose tensors do not fit the network of the trainer it
    # names: one error line.
    elsewhere, changed = tmp_path / "elsewhere", tmp_path / "changed"
    elsewhere.mkdir()
    changed.mkdir()
    (changed / copy.name).write_text((REPO / f"{trainer}.py").read_text())
    ckpt["trainer"] = trainer
    torch.save(ckpt, tmp_path / "renamed.pt")
    short = ["--num_episodes", "2", "--num_envs", "1"]
    evaluated, refused, named, mismatch, kept_file, changed_file = run_scripts([
        ("ppo_eval.py", [str(run), *short]),
        ("ppo_eval.py", [str(run)], elsewhere),
        ("ppo_eval.py", [str(run), *short, "--trainer", str(copy)], elsewhere),
        ("ppo_eval.py", [str(tmp_path / "renamed.pt")]),
        ("ppo_eval.py", [str(run), *short, "--run_trainer"], elsewhere),
        ("ppo_eval.py", [str(run), *short], changed)], tmp_path)
    assert kept_file.returncode == 0, kept_file.stderr[-3000:]
    assert kept_file.stdout.splitlines()[2:] == evaluated.stdout.splitlines()[2:]
    assert changed_file.returncode == 2 and f"do not fit {name}.py's network" in changed_file.stderr
    assert "differs from the file that wrote" in changed_file.stderr and "--run_trainer" in changed_file.stderr
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"({name}.py," in evaluated.stdout
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"written by {name}.py, which is neither beside ppo_eval.py nor in the working directory" in refused.stderr
    assert named.returncode == 0, named.stderr[-3000:]
    assert named.stdout.splitlines()[2:] == evaluated.stdout.splitlines()[2:]  # the table; line 2 has the time
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


@pytest.mark.parametrize("trainer", ["ppo", "ippo"])
def test_a_copy_starts_from_the_originals_checkpoint_where_its_network_fits(tmp_path, trainer):
    """Fine-tuning the baseline with a change: a copy whose network is the original's starts a run of its own from
    the original's checkpoint (--checkpoint), which its startup line and hyperparameters name; --resume across files
    stays refused."""
    source = (REPO / f"{trainer}.py").read_text()
    copy = tmp_path / f"my_{trainer}.py"
    copy.write_text(source.replace('"""', '"""A copy with the same network. ', 1))
    argv = fast_args(ENV[trainer], "base", total_timesteps=32 * 2, **FLAGS[trainer])
    assert run_script(f"{trainer}.py", argv, tmp_path).returncode == 0
    base = load(tmp_path / "runs/base/final_ckpt.pt")
    started, refused = run_scripts([  # side by side
        (str(copy), fast_args(ENV[trainer], "tuned", total_timesteps=32 * 2, **FLAGS[trainer])
         + ["--checkpoint", "runs/base/final_ckpt.pt", "--learning_rate", "1e-30"]),
        (str(copy), ["--resume", "runs/base"])], tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"checkpoint_written_by={trainer}.py" in started.stdout
    tuned = load(tmp_path / "runs/tuned/final_ckpt.pt")
    assert tuned["trainer"] == copy.stem
    for key in base["model"]:  # a learning rate of 1e-30 keeps the weights it started from
        torch.testing.assert_close(base["model"][key], tuned["model"][key], rtol=0, atol=1e-20)
    assert refused.returncode == 2 and f"written by {trainer}.py, not {copy.stem}.py" in refused.stderr


def test_a_copy_with_state_of_its_own_starts_from_the_originals_checkpoint(tmp_path):
    """A copy that keeps an adaptive coefficient in a buffer of its Agent (as the contract says) fine-tunes ppo.py's
    checkpoint: the buffer, which that checkpoint lacks, starts from its initial value, and a note says so."""
    source = (REPO / "ppo.py").read_text()
    line = "        self.obs_dim = obs_dim\n"
    assert source.count(line) == 1
    copy = tmp_path / "my_coef.py"
    copy.write_text(source.replace(line, line + "        self.register_buffer(\"coef\", torch.tensor(0.5))\n"))
    assert run_script("ppo.py", fast_args(ENV["ppo"], "base", total_timesteps=32 * 2), tmp_path).returncode == 0
    tuned = run_script(str(copy), fast_args(ENV["ppo"], "tuned", total_timesteps=32 * 2)
                       + ["--checkpoint", "runs/base/final_ckpt.pt", "--learning_rate", "1e-30"], tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "note: ppo.py's checkpoint has no coef, which start from their initial values" in tuned.stderr
    base = load(tmp_path / "runs/base/final_ckpt.pt")["model"]
    model = load(tmp_path / "runs/tuned/final_ckpt.pt")["model"]
    assert model["coef"] == 0.5 and model.keys() - base.keys() == {"coef"}
    for key in base:  # a learning rate of 1e-30 keeps the weights it started from: the base checkpoint's
        torch.testing.assert_close(model[key], base[key], rtol=0, atol=1e-20)


def test_a_start_killed_before_its_first_checkpoint_is_started_again(tmp_path):
    """A start that a kill stopped before its first checkpoint left its TensorBoard file and videos: the same command
    starts the run afresh, what the killed start wrote moved aside; a run with a checkpoint is never touched."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "runs/r"
    writer = SummaryWriter(str(run))
    writer.add_scalar("charts/SPS", 1.0, 0)
    writer.close()
    (run / "videos").mkdir()
    argv = fast_args(ENV["ppo"], "r", **FLAGS["ppo"])
    # A start that fails after setting them aside (weights that do not fit) puts them back
    assert run_script("ppo.py", fast_args(ENV["ppo"], "small", hidden_sizes=8), tmp_path).returncode == 0
    killed = snapshot(run)
    failed = run_script("ppo.py", argv + ["--checkpoint", "runs/small/final_ckpt.pt"], tmp_path)
    assert failed.returncode == 2 and "--hidden_sizes 8" in failed.stderr and "held no checkpoint" in failed.stderr
    assert snapshot(run) == killed and not list(run.glob("unfinished_start_*"))
    result = run_script("ppo.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (aside,) = run.glob("unfinished_start_*")
    assert "held no checkpoint to continue from" in result.stderr
    assert {p.name for p in aside.iterdir()} >= {"videos"} and len(list(aside.glob("events.out.tfevents.*"))) == 1
    assert (run / "final_ckpt.pt").is_file() and len(list(run.glob("events.out.tfevents.*"))) == 1
    before = snapshot(run)
    again = run_script("ppo.py", argv, tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr and snapshot(run) == before


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_evaluating_a_copy_in_maniskill_cpu_workers(tmp_path):
    """ManiSkill's CPU simulation with 2 envs runs in forkserver workers, which import the copy by its module name:
    ppo_eval.py must make the copy importable there, even when it lies outside the working directory, or is the
    file the run kept (--run_trainer), imported under another name."""
    copy = make_copy("ppo", tmp_path / "ideas")
    run_copy(copy, fast_args("PushCube-v1", "pick", num_envs=1, num_eval_envs=1, num_steps=10, total_timesteps=10,
                             num_minibatches=1, update_epochs=1), tmp_path)
    evaluated, kept = run_scripts([  # the second with the file the run kept, under a module name of its own
        ("ppo_eval.py", ["runs/pick", "--trainer", str(copy), "--num_envs", "2", "--num_episodes", "2"]),
        ("ppo_eval.py", ["runs/pick", "--run_trainer", "--num_envs", "2", "--num_episodes", "2"])], tmp_path)
    for result in (evaluated, kept):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "(my_ppo.py, PushCube-v1" in result.stdout and "2 episodes on 2 envs" in result.stdout


def test_a_run_resumed_by_a_changed_file_keeps_both_and_says_so(tmp_path):
    """--resume by a file that differs from the one that wrote the checkpoint: one note line names the kept file; the
    run goes on, keeps the new file beside the first, and its later checkpoints name the new one."""
    copy = tmp_path / "my_ppo.py"
    copy.write_text((REPO / "ppo.py").read_text())
    run_copy(copy, fast_args(ENV["ppo"], "r", total_timesteps=32 * 2), tmp_path)
    first = hashlib.sha256(copy.read_bytes()).hexdigest()
    copy.write_text(copy.read_text() + "# a change\n")
    resumed = run_copy(copy, ["--resume", "runs/r", "--total_timesteps", str(32 * 3)], tmp_path)
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note:")]
    assert notes == [f"note: my_ppo.py differs from the file that wrote runs/r/ckpt_2.pt (kept in "
                     f"runs/r/source/{first[:12]}/my_ppo.py); the run goes on with this one"], resumed.stderr
    second = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert sorted(p.name for p in (tmp_path / "runs/r/source").iterdir()) == sorted([first[:12], second[:12]])
    assert load(tmp_path / "runs/r/ckpt_3.pt")["source_sha256"] == second


def test_a_trainer_given_another_trainers_flag_names_whose_it_is(tmp_path, capfd):
    """FLAGS_OF_SOME_TRAINERS (a checked copy in every trainer) says of each flag that not all trainers have which
    ones have it; each trainer refuses the others' flags in one line, --no_ forms too, before tyro's box."""
    modules = {"ppo.py": ppo, "ppo_rnn.py": ppo_rnn, "ppo_rgb.py": ppo_rgb, "ippo.py": ippo}
    fields = {name: {field.name for field in dataclasses.fields(module.Args)} for name, module in modules.items()}
    owners = {}
    for name in sorted(set().union(*fields.values()) - set.intersection(*fields.values())):
        have = [file for file in modules if name in fields[file]]
        owners[name] = have[0] if len(have) == 1 else f"{', '.join(have[:-1])} and {have[-1]}"
    assert ppo.FLAGS_OF_SOME_TRAINERS == owners
    refusal = refused_in_one_line(ppo_rgb, ["--seq_len", "3"], tmp_path, capfd, whole_process=False)
    assert refusal == "error: --seq_len is a flag of ppo_rnn.py, not of ppo_rgb.py"
    refusal = refused_in_one_line(ippo, ["--no_critic_obs"], tmp_path, capfd, whole_process=False)
    assert refusal == "error: --critic_obs is a flag of ppo.py, ppo_rnn.py and ppo_rgb.py, not of ippo.py"
    refusal = refused_in_one_line(ppo_rnn, ["--evaluate", "--checkpoint", "x.pt"], tmp_path, capfd, whole_process=False)
    assert refusal == ("error: --evaluate is not a flag of ppo_rnn.py: evaluate a checkpoint with python ppo_eval.py "
                       "runs/RUN (docs/checkpoints.md)")
    refusal = refused_in_one_line(ippo, ["--save_trajectory"], tmp_path, capfd, whole_process=False)
    assert refusal == ("error: --save_trajectory is not a flag of ippo.py: record a checkpoint's ManiSkill "
                       "trajectories with python ppo_eval.py runs/RUN --save_trajectory (docs/evaluation.md)")
