"""ppo_rgb.py: learning from images only and from Dict observations, images kept uint8, determinism, ManiSkill's
cameras through both CPU paths, evaluation, bad input."""

import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_rgb
import tests.envs  # noqa: F401  (registers the test envs)
from tests.util import (assert_same_numbers, fast_args, load, refused_in_one_line, run_script, scalars,
                        video_frames)

# Seeds 1-3 reach 16 of 16 in both variants by 4,096 steps (learning rate 1e-3 without the KL stop collapses to 12)
PIXELS = dict(num_envs=8, num_steps=32, num_minibatches=4, update_epochs=4, gamma=0.5, learning_rate=3e-4,
              total_timesteps=8192, eval_freq=16, num_eval_envs=8)


@pytest.mark.parametrize("env_id", ["tests.envs:PixelSide-v0", "tests.envs:PixelSideCue-v0"],
                         ids=["image", "dict"])
def test_a_pixel_task_is_learned_from_the_image(tmp_path, env_id):
    """PixelSide pays for naming the side of a square that only the image shows (random play 8 of 16); the Dict
    variant's cue flips which action pays, so both keys are needed. 8,192 steps, seconds on 2 cores. The update
    recomputes the rollout's log-probs, and ppo_eval.py evaluates the checkpoint."""
    result = run_script("ppo_rgb.py", fast_args(env_id, "pixels", **PIXELS), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    tags = scalars(tmp_path / "runs/pixels")
    assert tags["eval/return"][-1][1] >= 15
    assert max(value for _, value in tags["losses/first_minibatch_ratio_error"]) < 1e-5
    space = load(tmp_path / "runs/pixels/final_ckpt.pt")["observation_space"]
    image = space["spaces"]["image"] if env_id.endswith("Cue-v0") else space
    assert image == {"type": "Box", "shape": [36, 36, 3], "dtype": "uint8"}
    evaluated = run_script("ppo_eval.py", ["runs/pixels", "--num_episodes", "8", "--output", "out.json"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["metrics"]["return"]["mean"] >= 15


def test_images_stay_uint8_and_vectors_become_the_state():
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("tests.envs:PixelSideCue-v0")] * 2,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = ppo_rgb.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    try:
        assert envs.obs_layout == {"image": ((36, 36, 3), torch.uint8), "state": ((1,), torch.float32)}
        obs = envs.reset(seed=0)
        assert obs["image"].dtype == torch.uint8 and obs["image"].shape == (2, 36, 36, 3)
        assert obs["state"].shape == (2, 1) and set(obs["state"].flatten().tolist()) <= {-1.0, 1.0}
        buf = ppo_rgb.RolloutBuffer(4, envs, torch.device("cpu"))
        assert buf.obs["image"].dtype == torch.uint8 and buf.obs["image"].shape == (4, 2, 36, 36, 3)
        for _ in range(16):  # the time limit: the final observations are dicts too
            next_obs, _, _, truncated, final_obs, finished = envs.step(torch.zeros(2, dtype=torch.long))
        assert truncated.all() and finished is not None
        assert final_obs["image"].dtype == torch.uint8 and not torch.equal(final_obs["image"], next_obs["image"])
    finally:
        envs.close()


def test_same_seed_same_numbers(tmp_path):
    flags = dict(PIXELS, total_timesteps=8 * 32 * 3, eval_freq=2, norm_obs=True)
    for name in ("a", "b"):
        result = run_script("ppo_rgb.py", fast_args("tests.envs:PixelSideCue-v0", name, **flags), tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    assert_same_numbers(tmp_path / "runs/a", tmp_path / "runs/b")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("num_envs,obs_mode", [(1, "rgb"), (2, "rgbd")], ids=["in-process", "workers"])
def test_maniskill_cameras_through_both_cpu_paths(tmp_path, num_envs, obs_mode):
    """PushCube-v1's camera (128x128) and state, and a critic's privileged state, through ManiSkillVectorEnv (one
    env) and worker processes (two): logs, checkpoints and evaluation videos; depth stays ManiSkill's int16. Episodes
    of 10 steps (--max_episode_steps) rather than the task's 50: each step renders the cameras and the video."""
    argv = fast_args("PushCube-v1", "cams", num_envs=num_envs, num_eval_envs=num_envs, num_steps=10,
                     num_minibatches=1, update_epochs=1, total_timesteps=10 * num_envs * 2, eval_freq=2,
                     obs_mode=obs_mode, capture_video=True, critic_obs=True, norm_obs=True, max_episode_steps=10)
    result = run_script("ppo_rgb.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs/cams"
    tags = scalars(run)
    assert "eval/success_once" in tags and [value for _, value in tags["eval/episode_len"]] == [10.0]
    spaces = load(run / "final_ckpt.pt")["observation_space"]["spaces"]
    assert spaces["rgb"] == {"type": "Box", "shape": [128, 128, 3], "dtype": "uint8"}
    assert spaces["state"]["shape"] == [25]
    assert spaces["critic"]["shape"] == [35]  # obs_mode="state": the cube's and the goal's poses too
    if obs_mode == "rgbd":
        assert spaces["depth"] == {"type": "Box", "shape": [128, 128, 1], "dtype": "int16"}
    videos = list((run / "videos").glob("*.mp4"))
    assert videos and all(video_frames(v)[0] == 11 for v in videos)  # the reset's frame and 10 steps'


@pytest.mark.parametrize("argv,mention", [
    (["--env_id", "PushCube-v1", "--obs_mode", "pointcloud"], "--obs_mode must be one of rgb, rgbd, depth"),
    (["--env_id", "tests.envs:PixelSide-v0", "--aug_shift", "-1"], "--aug_shift must be 0 (off) or a number"),
    (["--env_id", "CartPole-v1"], "holds no image; for vector observations use ppo.py"),
    (["--env_id", "tests.envs:PointMassButtons-v0"], "holds no image"),
    (["--env_id", "tests.envs:Choice-v0"], "holds no image"),
    (["--env_id", "tests.envs:PixelSide-v0", "--critic_obs"], "info['critic']"),
])
def test_bad_input_is_one_clear_line(tmp_path, capfd, argv, mention):
    line = refused_in_one_line(ppo_rgb, argv + ["--num_envs", "2", "--num_minibatches", "2", "--no_capture_video"],
                               tmp_path, capfd, whole_process=False)
    assert mention in line, line


def test_small_images_and_other_entries_are_refused_in_one_line():
    too_small = gym.spaces.Box(0, 255, (16, 16, 3), "uint8")
    with pytest.raises(ppo_rgb.UserError, match="at least 36x36"):
        ppo_rgb.observation_layout(too_small)
    with pytest.raises(ppo_rgb.UserError, match="'button'"):
        ppo_rgb.observation_layout(gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (64, 64, 3), "uint8"),
                                                    "button": gym.spaces.Discrete(2)}))


def test_aug_shift_moves_each_image_by_its_own_offset_and_still_learns(tmp_path):
    """Against a crop written out: each image comes back shifted by at most aug_shift pixels in each direction, the
    border repeated; PixelSide is still learned with --aug_shift 4 (its squares stay on their sides)."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (6, 40, 40, 3), dtype=torch.uint8)
    torch.manual_seed(1)
    shifted = ppo_rgb.random_shift(images, 4)
    torch.manual_seed(1)
    offsets = torch.randint(0, 9, (2, 6, 1))
    assert shifted.dtype == torch.uint8 and shifted.shape == images.shape
    for i in range(6):
        rows = (offsets[0, i, 0] + torch.arange(40) - 4).clamp(0, 39)
        columns = (offsets[1, i, 0] + torch.arange(40) - 4).clamp(0, 39)
        assert torch.equal(shifted[i], images[i][rows][:, columns])
    assert len({tuple(offsets[:, i, 0].tolist()) for i in range(6)}) > 1  # not one offset for all

    result = run_script("ppo_rgb.py", fast_args("tests.envs:PixelSide-v0", "shifted", aug_shift=4, **PIXELS), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert scalars(tmp_path / "runs/shifted")["eval/return"][-1][1] >= 15


def test_aug_shift_of_stacked_seeds_shifts_each_seeds_images_as_it_alone_does():
    """--num_seeds: 3 seeds' minibatches of images (seeds, N, H, W, C) in update()'s optimizer.draws(): each seed's
    images shifted as random_shift shifts them in a run of that seed alone, from its own generator."""
    images = torch.randint(0, 256, (3, 6, 40, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    generators = [torch.Generator().manual_seed(seed) for seed in (5, 6, 7)]
    with ppo_rgb.PerSeedDraws(generators):
        shifted = ppo_rgb.random_shift(images, 4)
    for i, seed in enumerate((5, 6, 7)):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            assert torch.equal(shifted[i], ppo_rgb.random_shift(images[i], 4))


def test_atari_preprocessing_repeats_actions_stacks_frames_and_limits_steps():
    """Against the ALE's frame counter and screen: 4 frames a step, the last frame's grayscale screen at 84x84 as the
    newest of 4 stacked channels (each step shifts the stack by one), and a time limit that counts steps, not frames
    (the task's own: the ALE's 108,000 frames)."""
    cv2 = pytest.importorskip("cv2")
    assert ppo_rgb.find_env("ALE/Pong-v5") == (False, 108_000 // 4)
    env = ppo_rgb.build_gym_env("ALE/Pong-v5", 12, None, None, None, "train")
    ale = env.unwrapped.ale
    previous, _ = env.reset(seed=0)
    assert previous.shape == env.observation_space.shape == (84, 84, 4) and previous.dtype == np.uint8
    env.action_space.seed(0)
    changed = 0
    for step in range(1, 13):
        frame = ale.getEpisodeFrameNumber()
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert ale.getEpisodeFrameNumber() == frame + 4
        assert np.array_equal(obs[..., :3], previous[..., 1:])
        screen = cv2.resize(ale.getScreenGrayscale(), (84, 84), interpolation=cv2.INTER_AREA)
        # the newest channel is the max of the last two frames: at least the last one's, and mostly equal to it
        assert (obs[..., 3].astype(int) >= screen.astype(int) - 1).all() and (obs[..., 3] == screen).mean() > 0.95
        changed += not np.array_equal(obs[..., 3], previous[..., 3])
        assert truncated == (step == 12) and not terminated
        previous = obs
    assert changed >= 8  # the frames move: a stack of one frame repeated would pass the shift check
    env.close()


def test_clipped_rewards_train_and_unclipped_returns_are_logged():
    """--reward_scale 5 --clip_reward 1 on PixelSide (rewards 0 or 1): the buffer holds 0 or 1, and each episode's
    logged return is its plain sum of rewards, neither scaled nor clipped."""
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("tests.envs:PixelSide-v0")] * 2,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = ppo_rgb.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    args = ppo_rgb.Args(num_envs=2, num_steps=16, reward_scale=5.0, clip_reward=1.0)
    torch.manual_seed(0)
    agent = ppo_rgb.make_agent(args, envs)
    buf = ppo_rgb.RolloutBuffer(16, envs, torch.device("cpu"))
    _, episodes = ppo_rgb.rollout(agent, envs, buf, envs.reset(seed=0), agent.get_action_and_value, None, args,
                                  "truncated")
    envs.close()
    assert set(buf.rewards.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(episodes["return"], buf.rewards.sum(0))  # one 16-step episode per env


def test_an_atari_game_trains_records_and_evaluates(tmp_path):
    """ALE/Pong-v5 with its own time limit: the run directory is named after the id without its '/', the evaluation
    episode is filmed, the checkpoint holds the stacked frames' space, and ppo_eval.py evaluates it."""
    argv = fast_args("ALE/Pong-v5", None, num_envs=4, num_steps=32, total_timesteps=256, eval_freq=2,
                     clip_reward=1.0, capture_video=True)
    result = run_script("ppo_rgb.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("ALE_Pong-v5__ppo_rgb__1__")
    assert -21 <= scalars(run)["eval/return"][-1][1] <= 21
    assert load(run / "final_ckpt.pt")["observation_space"] == {"type": "Box", "shape": [84, 84, 4], "dtype": "uint8"}
    assert [path.name for path in (run / "videos").iterdir()] == ["eval-episode-0.mp4"]
    evaluated = run_script("ppo_eval.py", [str(run), "--num_episodes", "2", "--output", "out.json"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["metrics"]["return"]["episodes"] == 2


def test_an_atari_id_without_ale_py_says_what_to_install(monkeypatch):
    monkeypatch.delitem(sys.modules, "ale_py")
    with pytest.raises(ppo_rgb.UserError, match="pip install ale-py"):
        ppo_rgb.find_env("ALE/NoSuchGame-v5")
