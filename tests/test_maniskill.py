"""ppo.py on ManiSkill's CPU simulation, through both env paths.

num_envs=1 takes ManiSkillVectorEnv, the same tensor code as thousands of GPU envs; num_envs>1 takes
Gymnasium's AsyncVectorEnv of CPUGymWrapper envs in forkserver workers.
"""

import os
import re
import signal
import time

import pytest
import torch

import ppo
from tests.util import REPO, fast_args, load, run_script, scalars, start_script

pytest.importorskip("mani_skill")

# Short rollouts; evaluation runs PickCube's full 50-step episodes.
PICK_CUBE = dict(num_steps=10, num_minibatches=1, update_epochs=1, eval_freq=1, capture_video=True, gamma=0.8, gae_lambda=0.9)


def check_run(run_dir, num_eval_envs):
    tags = scalars(run_dir)
    for tag in ("eval/return", "eval/success_once", "eval/success_at_end", "eval/episode_len", "losses/value_loss",
                "charts/SPS"):
        assert tag in tags, tag
    assert all(value == 50 for _, value in tags["eval/episode_len"])  # eval episodes run to the time limit
    assert all(value == num_eval_envs for _, value in tags["eval/episodes"])
    assert all(0.0 <= value <= 1.0 for _, value in tags["eval/success_once"])
    ckpt = load(run_dir / "ckpt_1.pt")
    assert ckpt["args"]["env_id"] == "PickCube-v1" and ckpt["observation_space"]["shape"] == [42]
    assert ckpt["action_space"]["type"] == "Box" and ckpt["action_space"]["shape"] == [8]
    agent = ppo.Agent(42, ckpt["action_space"], norm_obs=False)
    agent.load_state_dict(ckpt["model"])
    videos = list((run_dir / "videos").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 10_000 for v in videos)


def test_one_env_through_maniskill_vector_env(tmp_path):
    result = run_script("ppo.py", fast_args("PickCube-v1", "one", num_envs=1, num_eval_envs=1, total_timesteps=20,
                                            **PICK_CUBE), tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "one"
    check_run(run, 1)
    assert sorted(p.name for p in run.glob("*.pt")) == ["ckpt_1.pt", "ckpt_2.pt", "final_ckpt.pt"]
    assert "bootstrap_rule=always" in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_two_envs_in_workers_and_group_signal(tmp_path, signum):
    """Ctrl-C or a scheduler's SIGTERM reaches the whole process group: the workers keep going, the learner
    checkpoints and exits 128 + signum."""
    proc = start_script("ppo.py", fast_args("PickCube-v1", "two", num_envs=2, num_eval_envs=2,
                                            total_timesteps=20 * 1000, **PICK_CUBE), tmp_path)
    run = tmp_path / "runs" / "two"
    deadline = time.time() + 600
    while not (run / "ckpt_1.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signum)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signum, stderr
    assert "resume with: python " + str(REPO / "ppo.py") + " --resume runs/two" in stderr
    saved = re.search(r"saved (\S+) at iteration (\d+)", stderr)
    assert load(tmp_path / saved.group(1))["iteration"] == int(saved.group(2))
    check_run(run, 2)


@pytest.mark.parametrize("num_envs", [1, 2])
def test_final_observation_at_time_limit(tmp_path, num_envs):
    """At the time limit every env reports its true last observation, and next_obs is already the reset one."""
    args = ppo.Args(env_id="PickCube-v1", num_envs=num_envs, partial_reset=False, capture_video=False)
    envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=50)
    try:
        envs.reset(seed=0)
        action = torch.zeros(num_envs, 8)
        action[:, 0] = 1.0  # keep the arm moving so that the last and the reset observation differ
        for step in range(1, 51):
            next_obs, reward, terminated, truncated, final_obs, finished = envs.step(action)
            if step < 50:
                assert finished is None and torch.equal(final_obs, next_obs) and not truncated.any()
                previous = next_obs
        assert truncated.all() and not terminated.any()
        assert finished["episode_len"].tolist() == [50.0] * num_envs and len(finished["return"]) == num_envs
        assert "success_once" in finished and "success_at_end" in finished
        # the final observation continues the trajectory; the next one starts a new episode
        assert (final_obs - previous).abs().max() < (next_obs - previous).abs().max()
        assert not torch.allclose(final_obs, next_obs)
    finally:
        envs.close()


def test_dict_action_space_is_flattened(tmp_path):
    args = ppo.Args(env_id="TwoRobotPickCube-v1", num_envs=1, capture_video=False)
    envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=50)
    try:
        assert envs.single_action_space.shape == (16,)  # two 8-dimensional arms
        envs.reset(seed=0)
        next_obs, reward, *_ = envs.step(torch.zeros(1, 16))
        assert next_obs.shape == (1, envs.obs_dim) and reward.shape == (1,)
    finally:
        envs.close()


def test_missing_assets_fail_with_one_line(tmp_path):
    result = run_script("ppo.py", ["--env_id", "AnymalC-Reach-v1", "--num_envs", "1", "--num_eval_envs", "1", "--num_minibatches", "1",
                                   "--no_capture_video"], tmp_path, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "python -m mani_skill.utils.download_asset AnymalC-Reach-v1" in errors[0]
    assert "Traceback" not in result.stderr


def test_missing_vulkan_driver_fails_with_one_line(tmp_path):
    no_driver = {"VK_ICD_FILENAMES": str(tmp_path / "none.json"), "VK_DRIVER_FILES": str(tmp_path / "none.json")}
    result = run_script("ppo.py", ["--env_id", "PickCube-v1", "--num_envs", "1", "--num_eval_envs", "1",
                                   "--num_minibatches", "1", "--no_capture_video"], tmp_path, timeout=300,
                        extra_env=no_driver)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "scripts/install_cpu_vulkan.sh" in errors[0]
    assert "Traceback" not in result.stderr
