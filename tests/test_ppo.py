"""ppo.py end to end on Gymnasium envs: ratio, determinism, checkpoints, resume, signals, non-finite guard, bad
input."""

import dataclasses
import errno
import json
import os
import signal
import sys
import types
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import ippo
import ppo
import ppo_eval
import ppo_rgb
import ppo_rnn
from tests.util import (REPO, assert_refused_as_in_use, assert_same_numbers, fast_args, load, refused_in_one_line,
                        run_python, run_script, run_scripts, running, scalars, sigterm_beside_full_run, snapshot,
                        video_frames)

POINT_MASS = "tests.envs:PointMass-v0"


def test_first_minibatch_ratio_is_one(tmp_path):
    """Rollout and update compute the same log-probs, with observation normalization on (Box and Discrete)."""
    runs = (("Pendulum-v1", "pend"), ("CartPole-v1", "cart"))
    results = run_scripts([("ppo.py", fast_args(env_id, name, norm_obs=True, total_timesteps=32 * 3, target_kl=None))
                           for env_id, name in runs], tmp_path)
    for (_, name), result in zip(runs, results):
        assert result.returncode == 0, result.stderr
        tags = scalars(tmp_path / "runs" / name)
        errors = [v for _, v in tags["losses/first_minibatch_ratio_error"]]
        assert len(errors) == 3 and max(errors) < 1e-5
        assert [v for _, v in tags["losses/minibatch_steps"]] == [4.0] * 3  # 2 epochs x 2 minibatches


def test_target_kl_stops_the_update(tmp_path):
    result = run_script("ppo.py", fast_args("Pendulum-v1", "kl", total_timesteps=32 * 3, target_kl=1e-12), tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(v <= 1.0 for _, v in scalars(tmp_path / "runs/kl")["losses/minibatch_steps"])


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn], ids=["ppo", "ppo_rnn"])
def test_a_kl_stop_logs_the_losses_of_the_last_minibatch_that_stepped(tmp_path, monkeypatch, trainer):
    """Here the update stops after one or two of its 8 minibatches: the logs show the last one that stepped."""
    policy_losses = []

    def recording(fn, enabled):
        def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            if isinstance(result[0], tuple):  # the update's losses, not the rollout's policy step
                policy_losses.append(result[0][0].item())
            return result
        return call

    monkeypatch.setattr(trainer, "compile_unless_unavailable", recording)
    monkeypatch.chdir(tmp_path)
    argv = fast_args("Pendulum-v1", "kl", total_timesteps=32, ent_coef=0.01, learning_rate=3e-3, target_kl=0.003,
                     update_epochs=4, save_model=False, **({"seq_len": 8} if trainer is ppo_rnn else {}))
    assert trainer.cli(argv) == 0
    tags = scalars(tmp_path / "runs/kl")
    [(_, steps)] = tags["losses/minibatch_steps"]
    assert 1 <= steps < 8 and len(policy_losses) == steps + 1  # the last minibatch computed stopped the update
    assert tags["losses/policy_loss"][0][1] == pytest.approx(policy_losses[-2], rel=1e-6) != policy_losses[-1]


def test_same_seed_same_numbers(tmp_path):
    argv = dict(norm_obs=True, total_timesteps=32 * 4, lr_schedule="adaptive")
    runs = [("ppo.py", fast_args("Pendulum-v1", name, **argv, **extra)) for name, extra in (("a", {}), ("b", {}),
                                                                                          ("c", dict(seed=2)))]
    assert [result.returncode for result in run_scripts(runs, tmp_path)] == [0, 0, 0]
    assert_same_numbers(tmp_path / "runs/a", tmp_path / "runs/b")
    assert scalars(tmp_path / "runs/c")["losses/policy_loss"] != scalars(tmp_path / "runs/a")["losses/policy_loss"]


def test_async_envs_step_in_workers_with_the_same_numbers(tmp_path, monkeypatch):
    """--async_envs moves the training envs into worker processes and changes nothing else; episodes terminate and
    are truncated (final observations come back from the workers). ppo_rnn.py's envs are checked copies of these."""
    built = []

    class SpyAsyncVectorEnv(gym.vector.AsyncVectorEnv):
        def __init__(self, env_fns, **kwargs):
            super().__init__(env_fns, **kwargs)
            built.append(len(self.processes))

    monkeypatch.setattr(gym.vector, "AsyncVectorEnv", SpyAsyncVectorEnv)
    monkeypatch.chdir(tmp_path)
    argv = dict(num_envs=3, num_steps=24, num_minibatches=3, total_timesteps=3 * 24 * 2)
    assert ppo.cli(fast_args("tests.envs:PointMassEnds-v0", "sync", **argv)) == 0
    assert built == []
    assert ppo.cli(fast_args("tests.envs:PointMassEnds-v0", "async", async_envs=True, **argv)) == 0
    assert built == [3]  # the training envs only: evaluation stays in this process
    assert_same_numbers(tmp_path / "runs/sync", tmp_path / "runs/async")


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ppo_rgb], ids=["ppo", "ppo_rnn", "ppo_rgb"])
def test_compile_stays_close_to_eager_and_falls_back_in_one_line(tmp_path, monkeypatch, capsys, trainer):
    monkeypatch.chdir(tmp_path)
    env_id = "tests.envs:PointMassPixels-v0" if trainer is ppo_rgb else "Pendulum-v1"
    argv = dict(total_timesteps=32 * 2, eval_freq=2)
    assert trainer.cli(fast_args(env_id, "eager", **argv)) == 0
    assert trainer.cli(fast_args(env_id, "compiled", compile=True, **argv)) == 0
    assert "warning" not in capsys.readouterr().err
    eager, compiled = scalars(tmp_path / "runs/eager"), scalars(tmp_path / "runs/compiled")
    for tag in ("losses/policy_loss", "losses/value_loss", "eval/return"):
        assert [v for _, v in compiled[tag]] == pytest.approx([v for _, v in eager[tag]], rel=1e-3, abs=1e-5), tag

    def unavailable(fn, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", unavailable)
    assert trainer.cli(fast_args(env_id, "fallback", compile=True, **argv)) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == ["warning: --compile: torch.compile failed (no C++ compiler found); running eagerly"] * 2
    assert_same_numbers(tmp_path / "runs/eager", tmp_path / "runs/fallback")


def test_checkpoint_contents(tmp_path):
    result = run_script("ppo.py", fast_args("CartPole-v1", "run", norm_obs=True, anneal_lr=True, learning_rate=0.001),
                        tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bootstrap_rule=truncated" in result.stdout  # the default for Gymnasium envs
    run = tmp_path / "runs" / "run"
    assert sorted(p.name for p in run.glob("*.pt")) == ["ckpt_2.pt", "ckpt_4.pt", "final_ckpt.pt"]
    ckpt = load(run / "final_ckpt.pt")
    assert ckpt["trainer"] == "ppo" and ckpt["iteration"] == 4 and ckpt["global_step"] == 128
    assert ckpt["args"]["env_id"] == "CartPole-v1" and ckpt["args"]["norm_obs"] is True
    assert (ckpt["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
            and ckpt["observation_space"]["shape"] == [4])
    assert ckpt["model"]["obs_normalizer.count"] > 128 and ckpt["optimizer"]["state"]
    assert {"torch", "numpy", "python"} <= set(ckpt["rng"])
    assert not list(run.glob("*.tmp"))
    tags = scalars(run)
    for tag in ("charts/learning_rate", "losses/value_loss", "losses/approx_kl", "losses/old_approx_kl",
                "losses/clipfrac", "losses/explained_variance", "charts/SPS", "time/rollout_time",
                "time/update_time", "train/return", "train/episode_len", "charts/episodic_return",
                "eval/return", "eval/episode_len"):
        assert tag in tags, tag
    assert [step for step, _ in tags["eval/return"]] == [64, 128]
    assert [value for _, value in tags["charts/learning_rate"]] == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3])
    # an untrained CartPole policy fails within ~30 of the 500 evaluation steps; only the first episode counts
    assert [value for _, value in tags["eval/episodes"]] == [1.0, 1.0]
    assert all(value < 100 for _, value in tags["eval/episode_len"])

    # Five runs from that checkpoint, side by side: --checkpoint starts a new run from those weights; the network of a
    # --norm_obs run needs --norm_obs; a checkpoint of another format is refused in words; one of another trainer file
    # whose network fits (a copy's baseline) starts a run, which says where it came from; resuming it is refused in
    # words
    torch.save({**ckpt, "format": 1}, tmp_path / "old.pt")
    torch.save({**ckpt, "trainer": "my_idea"}, tmp_path / "other.pt")
    again, mismatch, old, other, other_resumed = run_scripts([
        ("ppo.py", fast_args("CartPole-v1", "from_ckpt", norm_obs=True, total_timesteps=32,
                             checkpoint=run / "final_ckpt.pt")),
        ("ppo.py", fast_args("CartPole-v1", "no_norm", checkpoint=run / "final_ckpt.pt")),
        ("ppo.py", fast_args("CartPole-v1", "old", norm_obs=True, checkpoint="old.pt")),
        ("ppo.py", fast_args("CartPole-v1", "other", norm_obs=True, checkpoint="other.pt")),
        ("ppo.py", ["--resume", "other.pt"])], tmp_path)
    assert again.returncode == 0, again.stderr
    assert (load(tmp_path / "runs/from_ckpt/final_ckpt.pt")["model"]["obs_normalizer.count"]
            > ckpt["model"]["obs_normalizer.count"])
    assert mismatch.returncode == 2
    assert mismatch.stderr.strip().splitlines()[-1] == ("error: the checkpoint was trained with --norm_obs, and its "
                                                        "network needs the same: pass --norm_obs")
    assert old.returncode == 2 and "has checkpoint format 1" in old.stderr.strip().splitlines()[-1], old.stderr
    assert other.returncode == 0 and "checkpoint_written_by=my_idea.py" in other.stdout, other.stderr
    assert (other_resumed.returncode == 2
            and "written by my_idea.py" in other_resumed.stderr.strip().splitlines()[-1]), other_resumed.stderr
    # ... and a run started from a checkpoint can be resumed without naming the checkpoint it started from
    longer = run_script("ppo.py", ["--resume", "runs/from_ckpt", "--total_timesteps", "64"], tmp_path)
    assert longer.returncode == 0, longer.stderr
    assert load(tmp_path / "runs/from_ckpt/final_ckpt.pt")["global_step"] == 64


def test_network_flags_shape_the_networks_and_travel_in_checkpoints(tmp_path):
    network = ["--hidden_sizes", "64", "32", "--activation", "relu", "--log_std_init", "-2"]
    result = run_script("ppo.py", fast_args("Pendulum-v1", "small") + network, tmp_path)
    assert result.returncode == 0, result.stderr
    ckpt = load(tmp_path / "runs/small/final_ckpt.pt")
    assert ckpt["args"]["hidden_sizes"] == (64, 32) and ckpt["args"]["activation"] == "relu"
    shapes = {key: tuple(value.shape) for key, value in ckpt["model"].items() if key.startswith("actor.")}
    assert shapes == {"actor.0.weight": (64, 3), "actor.0.bias": (64,), "actor.2.weight": (32, 64),
                      "actor.2.bias": (32,), "actor.4.weight": (1, 32), "actor.4.bias": (1,)}
    # 16 Adam steps of about 3e-4 each move the log std from where it started by at most about 0.005
    assert abs(float(ckpt["model"]["actor_logstd"]) + 2) < 0.01
    run = ppo_eval.run_args(ppo, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
    pendulum = types.SimpleNamespace(obs_dim=3, critic_dim=0, single_action_space=gym.spaces.Box(-2, 2, (1,)))
    relus = [layer for layer in ppo.make_agent(run, pendulum).modules() if isinstance(layer, torch.nn.ReLU)]
    assert len(relus) == 4  # two hidden layers in the actor and in the critic
    big, tanh, evaluated = run_scripts([  # side by side
        ("ppo.py", fast_args("Pendulum-v1", "big", checkpoint="runs/small/final_ckpt.pt")),
        ("ppo.py", fast_args("Pendulum-v1", "tanh", checkpoint="runs/small/final_ckpt.pt") + ["--hidden_sizes", "64",
                                                                                              "32"]),
        ("ppo_eval.py", ["runs/small", "--num_episodes", "1", "--num_envs", "1"])], tmp_path)
    assert big.returncode == 2 and "pass --hidden_sizes 64 32" in big.stderr
    assert tanh.returncode == 2 and "pass --activation=relu" in tanh.stderr
    assert evaluated.returncode == 0, evaluated.stderr


def test_video_for_gymnasium_env(tmp_path):
    result = run_script("ppo.py", fast_args(POINT_MASS, "vid", capture_video=True, total_timesteps=32 * 4,
                                            save_train_video_freq=2, save_model=False), tmp_path)
    assert result.returncode == 0, result.stderr
    assert not list((tmp_path / "runs/vid").glob("*.pt"))
    videos = list((tmp_path / "runs/vid/videos").glob("eval-episode-*.mp4"))
    # one 16-step episode per evaluation: its first observation's frame and a frame per step
    assert len(videos) == 2 and all(video_frames(v) == (17, (64, 64)) for v in videos)
    train_videos = list((tmp_path / "runs/vid/train_videos").glob("train-step-*.mp4"))
    assert sorted(v.name for v in train_videos) == ["train-step-0.mp4", "train-step-32.mp4"]  # iterations 1 and 3
    assert all(video_frames(v)[0] == 17 for v in train_videos)  # a 16-step rollout and the frame it starts from


@pytest.mark.parametrize("trainer", ["ppo.py", "ppo_rnn.py"])
def test_a_video_recorded_without_a_display_prints_no_error_line(tmp_path, trainer):
    """CartPole draws with pygame, whose SDL looks for a display and, finding none, would print "error:
    XDG_RUNTIME_DIR is invalid or not set"; the trainer's lines are all the error lines a run prints."""
    headless = {"DISPLAY": "", "WAYLAND_DISPLAY": "", "XDG_RUNTIME_DIR": ""}
    result = run_script(trainer, fast_args("CartPole-v1", "vid", capture_video=True), tmp_path, extra_env=headless)
    assert result.returncode == 0 and "error" not in result.stderr.lower(), result.stderr
    assert list((tmp_path / "runs/vid/videos").glob("eval-episode-*.mp4"))


def test_sigterm_then_resume_equals_uninterrupted_run(tmp_path):
    """Linear lr schedule, observation, reward and value normalization, a privileged critic's inputs and RNG streams
    all continue exactly. The siblings' SIGTERM and resume: tests/test_reliability.py's, under torchrun."""
    script, env_id, iterations, signal_after = "ppo.py", "tests.envs:PointMassCritic-v0", 100, 25
    argv = dict(total_timesteps=32 * iterations, eval_freq=signal_after, norm_obs=True, norm_reward=True,
                norm_value=True, critic_obs=True, lr_schedule="linear")
    run = tmp_path / "runs" / "cut"
    full, cut = sigterm_beside_full_run(script, fast_args(env_id, "full", **argv), fast_args(env_id, "cut", **argv),
                                        run / f"ckpt_{signal_after}.pt", tmp_path)
    assert full.returncode == 0, full.stderr
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr
    assert "resume with: python " + str(REPO / script) + " --resume runs/cut" in cut.stderr
    assert not (run / "final_ckpt.pt").exists()
    saved = max(int(p.stem.split("_")[1]) for p in run.glob("ckpt_*.pt"))
    assert signal_after <= saved < iterations
    assert load(run / f"ckpt_{saved}.pt")["iteration"] == saved

    resumed = run_script(script, ["--resume", "runs/cut"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load(tmp_path / "runs/full/final_ckpt.pt"), load(run / "final_ckpt.pt")
    assert a["global_step"] == b["global_step"] == 32 * iterations
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]
    # the reward statistics of every step's returns, not of the resumed part's alone
    assert b["reward_normalizer"]["return_rms.count"] == a["reward_normalizer"]["return_rms.count"] > 32 * iterations
    assert b["model"]["value_normalizer.count"] == a["model"]["value_normalizer.count"] > 32 * iterations
    # TensorBoard continues on the same step axis, without a gap or a repeat
    steps = [step for step, _ in scalars(run)["losses/value_loss"]]
    assert steps == list(range(32, 32 * (iterations + 1), 32))


def test_resume_from_an_older_checkpoint_sets_later_ones_aside(tmp_path):
    argv = dict(total_timesteps=32 * 8, eval_freq=2, lr_schedule="linear")
    assert run_script("ppo.py", fast_args(POINT_MASS, "r", **argv), tmp_path).returncode == 0
    run = tmp_path / "runs" / "r"
    first = load(run / "final_ckpt.pt")
    first_losses = scalars(run)["losses/value_loss"]
    result = run_script("ppo.py", ["--resume", "runs/r/ckpt_4.pt"], tmp_path)
    assert result.returncode == 0, result.stderr
    aside = list(run.glob("abandoned_after_4_*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["ckpt_6.pt", "ckpt_8.pt", "final_ckpt.pt"]
    again = load(run / "final_ckpt.pt")
    for key in first["model"]:
        assert torch.equal(first["model"][key], again["model"][key]), key
    # the TensorBoard steps after the checkpoint were purged and logged anew, with the same values
    assert scalars(run)["losses/value_loss"] == first_losses


def test_resume_refuses_a_different_experiment(tmp_path, capfd):
    """The refusals run in this process (refused_in_one_line): each would otherwise start torch anew."""
    assert run_script("ppo.py", fast_args(POINT_MASS, "r"), tmp_path).returncode == 0
    before = snapshot(tmp_path / "runs/r")
    assert "already holds a run" in refused_in_one_line(ppo, fast_args(POINT_MASS, "r"), tmp_path, capfd, False)
    assert snapshot(tmp_path / "runs/r") == before
    changed = ["--env_id", "Pendulum-v1", "--num_envs", "4", "--num_steps", "8", "--norm_obs", "--control_mode", "x",
               "--seed", "7", "--no_partial_reset", "--learning_rate", "0.1", "--lr_schedule", "adaptive",
               "--gamma", "0.5", "--gae_lambda", "0.5", "--reward_scale", "2", "--bootstrap_at_done", "never",
               "--clip_coef", "0.1", "--target_kl", "0.5", "--ent_coef", "0.1", "--num_minibatches", "4",
               "--num_eval_envs", "2", "--exp_name", "other"]
    error = refused_in_one_line(ppo, ["--resume", "runs/r", *changed], tmp_path, capfd, False)
    assert "--checkpoint" in error
    for flag in changed:
        if flag.startswith("--"):
            assert flag.replace("--no_", "--") + " " in error or flag.replace("--no_", "--") + "," in error, flag
    one = refused_in_one_line(ppo, ["--resume", "runs/r", "--gamma", "0.5"], tmp_path, capfd, False)
    assert "but --gamma differs from the run's" in one
    assert snapshot(tmp_path / "runs/r") == before
    assert "--total_timesteps" in refused_in_one_line(ppo, ["--resume", "runs/r"], tmp_path, capfd, False)
    # run-control flags may change
    longer = run_script("ppo.py", ["--resume", "runs/r", "--total_timesteps", "192", "--eval_freq", "1",
                                   "--torch_threads", "1", "--no_save_model", "--no_cuda"], tmp_path)
    assert longer.returncode == 0, longer.stderr


def test_a_failed_resume_changes_nothing_on_disk(tmp_path):
    """Resuming from an older checkpoint sets later ones aside, but only once the run has started: here the
    evaluation video's renderer is missing, and the run's files stay as they were."""
    argv = fast_args("tests.envs:PointMassNoVideo-v0", "r", total_timesteps=32 * 8, eval_freq=2)
    assert run_script("ppo.py", argv, tmp_path).returncode == 0
    run = tmp_path / "runs" / "r"
    before = snapshot(run)
    assert "ckpt_8.pt" in before and "final_ckpt.pt" in before
    result = run_script("ppo.py", ["--resume", "runs/r/ckpt_4.pt", "--capture_video"], tmp_path)
    assert result.returncode == 2 and "pip install pretend_renderer" in result.stderr, result.stderr
    assert snapshot(run) == before
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["source"]  # the run's own trainer file


def test_a_run_directory_has_one_writer(tmp_path):
    run = tmp_path / "runs" / "busy"
    with running("ppo.py", fast_args(POINT_MASS, "busy", total_timesteps=32 * 100_000, eval_freq=1), tmp_path,
                 run / "ckpt_1.pt") as proc:
        assert_refused_as_in_use(run_script("ppo.py", ["--resume", "runs/busy"], tmp_path), proc.pid)
    # the lock goes with the process that held it
    resumed = run_script("ppo.py", ["--resume", "runs/busy", "--total_timesteps", str(32 * (load(
        max(run.glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1])))["iteration"] + 1))], tmp_path)
    assert resumed.returncode == 0, resumed.stderr


def test_cli_gives_the_signals_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    assert ppo.cli(fast_args(POINT_MASS, "in_process", total_timesteps=32, save_model=False)) == 0
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers


def test_discrete_actions_with_an_offset_and_no_render_mode(tmp_path):
    """Choice-v0's actions are -1, 0, 1 and its constructor takes no render_mode; a step outside its space raises."""
    result, video = run_scripts([("ppo.py", fast_args("tests.envs:Choice-v0", "choice")),  # side by side
                                 ("ppo.py", fast_args("tests.envs:Choice-v0", "choice_video", capture_video=True))],
                                tmp_path)
    assert result.returncode == 0, result.stderr
    ckpt = load(tmp_path / "runs/choice/final_ckpt.pt")
    assert ckpt["action_space"] == {"type": "Discrete", "n": 3, "start": -1}
    assert 0.0 <= scalars(tmp_path / "runs/choice")["eval/return"][-1][1] <= 16.0
    # videos need a render_mode: one line, and nothing left on disk
    assert video.returncode == 2
    assert video.stderr.strip().splitlines()[-1] == ("error: tests.envs:Choice-v0 takes no render_mode, so it cannot "
                                                     "record videos; pass --no_capture_video")
    assert not (tmp_path / "runs/choice_video").exists()


@pytest.mark.parametrize("script", ["ppo.py", "ppo_rnn.py"])
@pytest.mark.parametrize("env_id,space", [
    ("MultiDiscreteTargets-v0", {"type": "MultiDiscrete", "shape": [3], "nvec": [3, 2, 4], "start": [-1, 0, 2]}),
    ("MultiBinaryTargets-v0", {"type": "MultiBinary", "shape": [3]})], ids=["MultiDiscrete", "MultiBinary"])
def test_multi_discrete_and_multi_binary_actions_learn_and_evaluate(tmp_path, monkeypatch, script, env_id, space):
    """Targets pays 1 for each dimension of the action that hits the target its observation shows (16-step
    episodes: 48 at most, random play about 22); its steps raise on an action outside the space, so the offsets
    of MultiDiscrete's start reach the env. ppo_eval.py evaluates the checkpoint with each dimension's mode."""
    flags = dict(num_envs=4, num_steps=64, num_minibatches=4, update_epochs=4, gamma=0.5, learning_rate=2e-3,
                 target_kl=None, total_timesteps=4096, eval_freq=8, num_eval_envs=4)
    flags.update(rnn_hidden_size=32) if script == "ppo_rnn.py" else flags.update(hidden_sizes="64 64")
    argv = [arg for flag in fast_args(f"tests.envs:{env_id}", "targets", **flags) for arg in flag.split(" ")]
    result = run_script(script, argv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert load(tmp_path / "runs/targets/final_ckpt.pt")["action_space"] == space
    assert scalars(tmp_path / "runs/targets")["eval/return"][-1][1] >= 40
    monkeypatch.chdir(tmp_path)  # ppo_eval.py in this process: a process of its own would start torch anew
    assert ppo_eval.cli(["runs/targets", "--num_episodes", "8", "--output", "out.json"]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["metrics"]["return"]["mean"] >= 40


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    # rewards turn NaN after 200 steps of each env: iteration 13 of 16-step rollouts
    result = run_script("ppo.py", fast_args("tests.envs:PointMassNaN-v0", "nan", total_timesteps=32 * 40, eval_freq=5),
                        tmp_path)
    assert result.returncode == 1
    assert "non-finite loss at iteration 13" in result.stderr and "ckpt_10.pt is untouched" in result.stderr
    assert "Traceback" not in result.stderr
    run = tmp_path / "runs" / "nan"
    assert sorted(p.name for p in run.glob("*.pt")) == ["ckpt_10.pt", "ckpt_5.pt"]
    ckpt = load(run / "ckpt_10.pt")
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


@pytest.mark.parametrize("trainer,env_id", [(ppo, POINT_MASS), (ppo_rnn, POINT_MASS),
                                            (ippo, "vmas:tests.vmas_scenarios:Clock")], ids=["ppo", "ppo_rnn", "ippo"])
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capfd, trainer,
                                                                              env_id):
    """The disk fills up while the second checkpoint is written: one error line naming the cause and the checkpoint
    to resume from, no traceback, no half-written file."""
    if trainer is ippo:
        pytest.importorskip("vmas")
    fsync = os.fsync

    def full_at_the_second_checkpoint(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("ckpt_2.pt.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_second_checkpoint)
    monkeypatch.chdir(tmp_path)
    assert trainer.cli(fast_args(env_id, "full", total_timesteps=32 * 4, eval_freq=100, checkpoint_freq=1)) == 1
    errors = [line for line in capfd.readouterr().err.splitlines() if "error" in line.lower() or "Traceback" in line]
    run = tmp_path / "runs" / "full"
    assert len(errors) == 1 and errors[0].startswith("error: the disk is full"), errors
    assert f"{run.relative_to(tmp_path)}/ckpt_2.pt" in errors[0] and "ckpt_1.pt is untouched" in errors[0]
    assert "--resume runs/full" in errors[0]
    assert sorted(p.name for p in run.iterdir() if p.name.endswith((".pt", ".tmp"))) == ["ckpt_1.pt"]
    assert load(run / "ckpt_1.pt")["iteration"] == 1


@pytest.mark.parametrize("error", [MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\n"
                                                                      "(advice over several lines)")])
def test_running_out_of_memory_is_one_line(tmp_path, monkeypatch, capfd, error):
    """The learner or the envs exhaust the memory (the host's, or a GPU's): one error line, no traceback."""
    def exhausted(*_, **__):
        raise error

    monkeypatch.setattr(ppo, "make_run_envs", exhausted)
    monkeypatch.chdir(tmp_path)
    assert ppo.cli(fast_args(POINT_MASS, "oom")) == 1
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: out of memory ("), lines


BAD_INPUTS = [
    (["--env_id", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
    (["--env_id", "no_such_module:Env-v0"], "no_such_module"),
    (["--env_id", "CartPole-v1", "--num_envs", "0"], "--num_envs"),
    (["--env_id", "CartPole-v1", "--num_envs", "3", "--num_steps", "5", "--num_minibatches", "4"], "num_minibatches"),
    (["--env_id", "CartPole-v1", "--num_envs", "2", "--num_steps", "8", "--num_minibatches", "2",
      "--total_timesteps", "10"],
     "--total_timesteps"),
    (["--env_id", "CartPole-v1", "--num_envs", "2", "--num_steps", "4", "--num_minibatches", "8"], "--norm_adv"),
    (["--env_id", "CartPole-v1", "--checkpoint", "missing.pt"], "missing.pt"),
    (["--resume", "runs/none"], "runs/none"),
    (["--env_id", "PickCube-v1", "--sim_backend", "gpu"], "CUDA"),
    (["--env_id", "CartPole-v1", "--gamma", "1.5"], "--gamma"),
    (["--env_id", "tests.envs:SequenceObs-v0"], "observation space"),
    (["--env_id", "tests.envs:PointMassButtons-v0"], "action space"),
    (["--env_id", "CartPole-v1", "--anneal_lr", "--lr_schedule", "adaptive"], "anneal_lr"),
    (["--env_id", "CartPole-v1", "--track"], "pip install wandb"),
    (["--env_id", "CartPole-v1", "--wandb_group", ""], "--wandb_group"),
    (["--env_id", "CartPole-v1", "--wandb_tags", "ok", ""], "--wandb_tags"),
    (["--env_id", "CartPole-v1", "--learning_rate", "nan"], "--learning_rate"),
    (["--env_id", "CartPole-v1", "--learning_rate", "inf"], "--learning_rate"),
    (["--env_id", "CartPole-v1", "--seed", "-1"], "--seed"),
    (["--env_id", "CartPole-v1", "--seed", str(2**32)], "--seed"),
    (["--env_id", "CartPole-v1", "--clip_coef", "-1"], "--clip_coef"),
    (["--env_id", "CartPole-v1", "--max_grad_norm", "0"], "--max_grad_norm"),
    (["--env_id", "CartPole-v1", "--max_grad_norm", "nan"], "--max_grad_norm"),
    (["--env_id", "CartPole-v1", "--target_kl", "0"], "--target_kl"),
    (["--env_id", "CartPole-v1", "--lr_factor", "1"], "--lr_factor"),
    (["--env_id", "CartPole-v1", "--min_learning_rate", "0.1", "--max_learning_rate", "0.01"], "--min_learning_rate"),
    (["--env_id", "CartPole-v1", "--kl_target", "-0.01"], "--kl_target"),
    (["--env_id", "CartPole-v1", "--torch_threads", "100000"], "--torch_threads"),
    (["--env_id", "CartPole-v1", "--exp_name", "../outside"], "--exp_name"),
    (["--env_id", "CartPole-v1", "--exp_name", "/tmp/outside"], "--exp_name"),
    (["--env_id", "CartPole-v1", "--gamma", "nan"], "--gamma"),
    (["--env_id", "CartPole-v1", "--gae_lambda", "-0.1"], "--gae_lambda"),
    (["--env_id", "CartPole-v1", "--ent_coef", "inf"], "--ent_coef"),
    (["--env_id", "CartPole-v1", "--vf_coef", "0"], "--vf_coef"),
    (["--env_id", "CartPole-v1", "--reward_scale", "0"], "--reward_scale"),
    (["--env_id", "CartPole-v1", "--num_eval_steps", "0"], "--num_eval_steps"),
    (["--env_id", "CartPole-v1", "--eval_reconfiguration_freq", "-1"], "--eval_reconfiguration_freq"),
    (["--env_id", "CartPole-v1", "--save_train_video_freq", "0"], "--save_train_video_freq"),
    (["--env_id", "CartPole-v1", "--update_epochs", "0"], "--update_epochs"),
    (["--env_id", "CartPole-v1", "--checkpoint", "."], "is a directory"),
    (["--env_id", "CartPole-v1", "--keep_checkpoints", "0"], "--keep_checkpoints"),
    (["--env_id", "CartPole-v1", "--checkpoint_freq", "0"], "--checkpoint_freq"),
    (["--env_id", "CartPole-v1", "--hidden_sizes", "64", "0"], "--hidden_sizes"),
    (["--env_id", "CartPole-v1", "--critic_obs"], "info['critic']"),
    (["--env_id", "PickCube-v1", "--critic_obs"], "ppo_rgb.py --critic_obs"),
    (["--env_id", "Pendulum-v1", "--log_std_init", "nan"], "--log_std_init"),
    # the defaults are sized for a GPU: 512 CPU simulator processes would not fit
    (["--env_id", "PickCube-v1", "--sim_backend", "cpu"], f"try --num_envs={2 * len(os.sched_getaffinity(0))} "),
]


# These run in a process of their own, the others in the test's (refused_in_one_line)
WHOLE_PROCESS = (["--env_id", "NoSuchEnv-v0"], ["--env_id", "CartPole-v1", "--num_envs", "0"])
assert all(any(argv == bad for bad, _ in BAD_INPUTS)
           for argv in WHOLE_PROCESS), "WHOLE_PROCESS names an input not in BAD_INPUTS"


@pytest.mark.parametrize("argv,mentions", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line(tmp_path, capfd, monkeypatch, argv, mentions):
    if "--sim_backend" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if "--track" in argv:
        monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec() finds no module
    full_argv = argv + ["--no_capture_video", "--num_eval_envs", "1"]
    absolute_escape = Path("/tmp/outside")  # another run's, or another user's, may be there already
    was_there = absolute_escape.exists()
    assert mentions in refused_in_one_line(ppo, full_argv, tmp_path, capfd, whole_process=argv in WHOLE_PROCESS)
    assert not (tmp_path / "runs").exists()  # a failed start leaves nothing behind, not even an empty directory
    assert not (tmp_path / "outside").exists() and absolute_escape.exists() == was_there  # the two --exp_name escapes


def test_resuming_another_trainers_checkpoint_names_both_files(tmp_path):
    """ippo.py's checkpoints have a format of their own: the line says which file wrote the checkpoint, not that its
    format is another."""
    path = tmp_path / "ckpt_1.pt"
    torch.save({"format": ippo.CHECKPOINT_FORMAT, "trainer": "ippo", "model": {}}, path)
    with pytest.raises(ppo.UserError, match="written by ippo.py, not ppo.py"):
        ppo.load_checkpoint(path)


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ippo, ppo_rgb], ids=["ppo", "ppo_rnn", "ippo", "ppo_rgb"])
def test_help_lists_every_flag(capsys, trainer):
    """In this process: `python ppo.py --help` would add a start of torch and the simulators."""
    with pytest.raises(SystemExit) as exited:
        trainer.cli(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(trainer.Args):
        assert f"--{field.name}" in out, field.name


@pytest.mark.parametrize("trainer,env_id", [("ppo", POINT_MASS), ("ppo_rnn", POINT_MASS),
                                            ("ippo", "vmas:tests.vmas_scenarios:Clock")])
def test_a_full_disk_under_the_logs_is_one_line_too(tmp_path, trainer, env_id):
    """TensorBoard writes its events in a thread of its own, which prints a failure as a traceback and hands it to
    the trainer's next write: one error line, and no checkpoint to resume from is promised where none was written."""
    if trainer == "ippo":
        pytest.importorskip("vmas")
    argv = fast_args(env_id, "full", total_timesteps=32 * 200, eval_freq=1000, save_model=False,
                     **({"max_episode_steps": 16} if trainer == "ippo" else {}))
    result = run_python(["-m", "tests.harness", "full_logs", trainer, *argv], tmp_path, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: the disk is full"), result.stderr[-3000:]
    assert errors[0].endswith("none was written")
