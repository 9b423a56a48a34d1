"""ppo.py on ManiSkill's CPU simulation, through both env paths.

num_envs=1 takes ManiSkillVectorEnv, the same tensor code as thousands of GPU envs; num_envs>1 takes
Gymnasium's AsyncVectorEnv of CPUGymWrapper envs in forkserver workers.
"""

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ippo
import ppo
import ppo_eval
import ppo_rgb
import ppo_rnn
from tests.util import (REPO, fast_args, load, run_script, run_scripts, scalars, start_script, video_frames,
                        wait_for)

pytest.importorskip("mani_skill")

# Short rollouts and 10-step episodes (--max_episode_steps; PickCube's own 50 steps:
# test_final_observation_at_time_limit and tests/test_eval.py): each evaluation step renders a video frame.
PICK_CUBE = dict(num_steps=10, num_minibatches=1, update_epochs=1, eval_freq=1, capture_video=True, gamma=0.8,
                 gae_lambda=0.9, max_episode_steps=10)


def check_run(run_dir, num_eval_envs):
    tags = scalars(run_dir)
    for tag in ("eval/return", "eval/success_once", "eval/success_at_end", "eval/episode_len", "losses/value_loss",
                "charts/SPS"):
        assert tag in tags, tag
    assert all(value == 10 for _, value in tags["eval/episode_len"])  # eval episodes run to the time limit
    assert all(value == num_eval_envs for _, value in tags["eval/episodes"])
    assert all(0.0 <= value <= 1.0 for _, value in tags["eval/success_once"])
    ckpt = load(run_dir / "ckpt_1.pt")
    assert ckpt["args"]["env_id"] == "PickCube-v1" and ckpt["observation_space"]["shape"] == [42]
    assert ckpt["action_space"]["type"] == "Box" and ckpt["action_space"]["shape"] == [8]
    agent = ppo.Agent(42, ckpt["action_space"], norm_obs=False, norm_value=False, hidden_sizes=(256, 256, 256),
                      activation="tanh", log_std_init=-0.5)
    agent.load_state_dict(ckpt["model"])
    videos = list((run_dir / "videos").glob("*.mp4"))
    assert videos and all(video_frames(v)[0] == 11 for v in videos)  # the reset's frame and 10 steps'


def test_one_env_through_maniskill_vector_env(tmp_path):
    result = run_script("ppo.py", fast_args("PickCube-v1", "one", num_envs=1, num_eval_envs=1, total_timesteps=20,
                                            **PICK_CUBE), tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "one"
    check_run(run, 1)
    assert sorted(p.name for p in run.glob("*.pt")) == ["ckpt_1.pt", "ckpt_2.pt", "final_ckpt.pt"]
    assert "bootstrap_rule=always" in result.stdout
    # the render backend is chosen from what the machine has, so a CPU run starts without warnings
    assert "Falling back" not in result.stderr and "WARNING" not in result.stderr, result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_two_envs_in_workers_and_group_signal(tmp_path, signum):
    """Ctrl-C or a scheduler's SIGTERM reaches the whole process group: the workers keep going, the learner
    checkpoints and exits 128 + signum. SIGTERM's run records evaluation videos too (the worker path's logs, metrics,
    checkpoints and videos); SIGINT's, without video (half of a run's time), evaluates in its workers after the
    signal as well."""
    video = signum == signal.SIGTERM
    proc = start_script("ppo.py", fast_args("PickCube-v1", "two", num_envs=2, num_eval_envs=2,
                                            total_timesteps=20 * 1000, **{**PICK_CUBE, "capture_video": video}),
                        tmp_path)
    run = tmp_path / "runs" / "two"
    # Once ckpt_2.pt is written the run cannot stop before iteration 2, but a signal sent at once can still land
    # before that iteration's end (a directory fsync, a log flush), with nothing left for the workers to do. A third
    # of an iteration later it lands in iteration 3 before its evaluation ends (0.22-0.29 s before, in iterations of
    # 0.40-0.45 s, on 2 cores).
    wait_for(run / "ckpt_1.pt", proc, 600)
    ckpt_1_seen = time.monotonic()
    wait_for(run / "ckpt_2.pt", proc, 600)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep((time.monotonic() - ckpt_1_seen) / 3)
    signalled = time.time()
    os.killpg(proc.pid, signum)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signum, stderr
    assert "resume with: python " + str(REPO / "ppo.py") + " --resume runs/two" in stderr
    saved = re.search(r"saved (\S+) at iteration (\d+)", stderr)
    assert load(tmp_path / saved.group(1))["iteration"] == int(saved.group(2))
    if video:
        check_run(run, 2)
    else:  # every iteration evaluated both envs' episodes, the one the signal came in too, ending after it
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        episodes = events.Scalars("eval/episodes")
        assert len(episodes) == int(saved.group(2)) and all(event.value == 2 for event in episodes)
        assert episodes[-1].wall_time > signalled


@pytest.mark.parametrize("trainer,env_id", [(ppo, "PushCube-v1"), (ippo, "TwoRobotPickCube-v1")], ids=["ppo", "ippo"])
def test_a_worker_env_autoresets_the_same_whatever_the_process_torch_stream(trainer, env_id):
    """Autoresets are unseeded; a worker's torch stream is seeded by no one, so it must not decide the next episode.
    (ppo_rnn.py's build_maniskill_cpu_worker_env is a checked copy of ppo.py's.)"""
    args = trainer.Args(env_id=env_id, sim_backend="cpu", max_episode_steps=50)
    kwargs, _ = trainer.maniskill_env_kwargs(args, 2, torch.device("cpu"), False, *([{}] if trainer is ippo else []))
    extra = ("full",) if trainer is ippo else ()
    episodes = []
    for process_seed in (0, 1):
        env = trainer.build_maniskill_cpu_worker_env(env_id, kwargs, *extra, False, None, None, None)
        torch.manual_seed(process_seed)
        first, _ = env.reset(seed=3)
        torch.manual_seed(100 + process_seed)
        second, _ = env.reset()
        episodes.append((first, second))
        env.close()
    assert (episodes[0][0] == episodes[1][0]).all() and (episodes[0][1] == episodes[1][1]).all()
    assert not (episodes[0][0] == episodes[0][1]).all()  # a new episode, not a replay of the seeded one


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
    result = run_script("ppo.py", ["--env_id", "AnymalC-Reach-v1", "--num_envs", "1", "--num_eval_envs", "1",
                                   "--num_minibatches", "1", "--no_capture_video"], tmp_path, timeout=300)
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


def test_custom_maniskill_task_takes_the_maniskill_path(tmp_path):
    """A task registered with ManiSkill's @register_env in the user's module, in worker processes (training) and
    through ManiSkillVectorEnv (evaluation): ManiSkill's bootstrap rule, time limit and success metrics."""
    from tests.maniskill_envs import SHORT_PUSH_CUBE_STEPS

    result = run_script("ppo.py", fast_args("tests.maniskill_envs:ShortPushCube-v1", "custom", num_envs=2, num_steps=10,
                                            num_minibatches=1, update_epochs=1, eval_freq=1, total_timesteps=20,
                                            control_mode="pd_ee_delta_pos"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bootstrap_rule=always" in result.stdout and f"num_eval_steps={SHORT_PUSH_CUBE_STEPS}" in result.stdout
    tags = scalars(tmp_path / "runs/custom")
    assert [value for _, value in tags["eval/episode_len"]] == [SHORT_PUSH_CUBE_STEPS]
    assert "eval/success_once" in tags and "eval/success_at_end" in tags
    # pd_ee_delta_pos reached the env: 3 position deltas and the gripper
    assert load(tmp_path / "runs/custom/final_ckpt.pt")["action_space"]["shape"] == [4]


@pytest.fixture
def gpu_sized_envs(monkeypatch):
    """Build ManiSkill envs as the GPU path does, on CPU: ppo.py asks for the GPU simulation and N envs; the env
    is one CPU env that reports N envs while ManiSkill's wrappers are built around it, so their num_envs > 1
    branches (RecordEpisode, ManiSkillVectorEnv) run. The envs can be built, not stepped."""
    import gymnasium as gym

    made = []
    real_make = gym.make

    def make(env_id, num_envs=1, **kwargs):
        made.append(dict(num_envs=num_envs, **kwargs))
        env = real_make(env_id, num_envs=1, **{**kwargs, "sim_backend": "physx_cpu"})
        env.unwrapped.num_envs = num_envs
        return env

    monkeypatch.setattr(gym, "make", make)
    for trainer in (ppo, ppo_rnn, ippo, ppo_rgb):
        monkeypatch.setattr(trainer, "resolve_sim_backend", lambda sim_backend: "gpu")
    return made


@pytest.mark.parametrize("trainer", [ppo, ppo_rgb], ids=["ppo", "ppo_rgb"])
def test_gpu_path_default_flags_build(tmp_path, gpu_sized_envs, trainer):
    """`python ppo.py --env_id=PickCube-v1` on a GPU: 512 training envs, 8 evaluation envs with video. (ppo_rnn.py's
    make_envs is a checked copy of ppo.py's; its own validate() of the GPU defaults: the torchrun test below.)"""
    args = trainer.Args(env_id="PickCube-v1", save_train_video_freq=10, critic_obs=trainer is ppo_rgb)
    args, _ = trainer.validate(args, maniskill=True, time_limit=50)
    envs = trainer.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=50)
    eval_envs = trainer.make_envs(args, True, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=50)
    try:
        train_kwargs, eval_kwargs = gpu_sized_envs
        assert train_kwargs["num_envs"] == 512 and eval_kwargs["num_envs"] == 8
        assert train_kwargs["sim_backend"] == eval_kwargs["sim_backend"] == "physx_cuda"
        assert train_kwargs["max_episode_steps"] == eval_kwargs["max_episode_steps"] == 50
        # RecordEpisode cannot flush at one env's reset: videos are cut at the evaluation's and the rollout's length
        assert eval_envs.video_recorder.max_steps_per_video == 50 and envs.video_recorder.max_steps_per_video == 50
        assert eval_envs.num_envs == 8 and envs.num_envs == 512
        if trainer is ppo_rgb:  # the camera's images and the state, through FlattenRGBDObservationWrapper
            assert train_kwargs["obs_mode"] == "rgb" and envs.obs_layout["rgb"] == ((128, 128, 3), torch.uint8)
            assert envs.obs_layout["state"][0] == (29,)
            # --critic_obs: the state observation, object poses included, for the critic of all 512 envs
            assert envs.obs_layout["critic"] == ((42,), torch.float32)
            assert envs.env.observation_space["critic"].shape == (512, 42)
        # 512 tiled 512x512 frames would be 400 MB each: the cameras shrink to keep a tiled frame near 1024 pixels
        assert train_kwargs["human_render_camera_configs"] == dict(width=42, height=42)  # 22 rows of 24
        assert eval_kwargs["human_render_camera_configs"] == dict(shader_pack="default", width=256, height=256)
    finally:
        envs.close()
        eval_envs.close()


def test_gpu_path_puts_the_seeds_in_blocks_of_one_simulation(tmp_path, gpu_sized_envs):
    """`ppo.py --num_seeds 4 --num_envs 16` on a GPU: one simulation of 64 training envs, seed i's block reset with
    the env seeds that ManiSkill gives a run of seed + i alone; each seed's 2 evaluation envs a simulation of its own,
    with its videos in its run directory."""
    args = ppo.Args(env_id="PickCube-v1", num_seeds=4, num_envs=16, num_eval_envs=2, num_minibatches=4)
    args, _ = ppo.validate(args, maniskill=True, time_limit=50)
    envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=50)
    eval_envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=50)
    try:
        train_kwargs, *eval_kwargs = gpu_sized_envs
        assert train_kwargs["num_envs"] == 64 and [kwargs["num_envs"] for kwargs in eval_kwargs] == [2] * 4
        assert envs.num_envs == 64 and (envs.num_seeds, envs.block) == (4, 16)
        assert [str(seed_envs.video_recorder.output_dir) for seed_envs in eval_envs] == [
            str(tmp_path / f"{tmp_path.name}__seed{seed}" / "videos") for seed in range(1, 5)]
        asked = []

        def reset(seed=None, options=None):
            asked.append(seed)
            return torch.zeros(64, envs.obs_dim), {}

        envs.envs.env.reset = reset  # the one CPU env cannot reset as 64
        assert envs.reset(seed=100).shape == (4, 16, envs.obs_dim)
        for i in range(4):  # sapien_env.py's _set_main_rng for a run's reset(seed=100 + i)
            block = asked[0][16 * i:16 * (i + 1)]
            assert block == [100 + i, *np.random.RandomState(100 + i).randint(2**31, size=15).tolist()]
    finally:
        envs.close()
        eval_envs.close()


@pytest.mark.parametrize("trainer,time_limit", [(ppo, 50), (ppo_rnn, 50), (ippo, 100)], ids=["ppo", "ppo_rnn", "ippo"])
def test_gpu_path_under_torchrun_simulates_on_the_rank_gpu(tmp_path, gpu_sized_envs, monkeypatch, trainer, time_limit):
    """Rank 3 of 4 on a node: its envs simulate and render on cuda:3, and the run takes a quarter of the iterations."""
    args = trainer.Args(capture_video=False)
    args, derived = trainer.validate(args, maniskill=True, time_limit=time_limit, num_ranks=4, local_ranks=4)
    assert derived["num_iterations"] == args.total_timesteps // (args.num_envs * args.num_steps * 4)
    monkeypatch.setattr(trainer, "TorchVecEnv", lambda env, *rest, **kwargs: env)  # its buffers would need the GPU
    monkeypatch.setattr(trainer.torch.cuda, "is_available", lambda: True)
    asked, sized_make = [], trainer.gym.make

    def make(env_id, **kwargs):
        asked.append(kwargs)
        return sized_make(env_id, **{**kwargs, "render_backend": "cpu"})  # this machine has no GPU to render on

    monkeypatch.setattr(trainer.gym, "make", make)
    envs = trainer.make_envs(args, True, torch.device("cuda", 3), evaluation=False, run_dir=tmp_path,
                             num_eval_steps=time_limit)
    envs.close()
    assert (asked[0]["num_envs"] == 512 and asked[0]["sim_backend"] == "physx_cuda:3"
            and asked[0]["render_backend"] == "gpu:3")


def test_ippo_gpu_path_default_flags_build(tmp_path, gpu_sized_envs):
    """`python ippo.py` (TwoRobotPickCube-v1) on a GPU: 512 training envs, 8 evaluation envs with video."""
    args = ippo.Args(save_train_video_freq=10)
    args, _ = ippo.validate(args, maniskill=True, time_limit=100)
    envs = ippo.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=100)
    eval_envs = ippo.make_envs(args, True, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=100)
    try:
        train_kwargs, eval_kwargs = gpu_sized_envs
        assert train_kwargs["num_envs"] == 512 and eval_kwargs["num_envs"] == 8
        assert train_kwargs["sim_backend"] == eval_kwargs["sim_backend"] == "physx_cuda"
        assert train_kwargs["obs_mode"] == "state_dict" and train_kwargs["max_episode_steps"] == 100
        assert eval_envs.video_recorder.max_steps_per_video == 100 and envs.video_recorder.max_steps_per_video == 50
        assert eval_envs.num_envs == 8 and envs.num_envs == 512
        assert envs.agents == ["panda_wristcam-0", "panda_wristcam-1"] and envs.obs_dim == 66
        assert train_kwargs["human_render_camera_configs"] == dict(width=42, height=42)
        assert eval_kwargs["human_render_camera_configs"] == dict(shader_pack="default", width=256, height=256)
    finally:
        envs.close()
        eval_envs.close()


def test_evaluator_gpu_path_builds_with_video_and_trajectory(tmp_path, monkeypatch, gpu_sized_envs):
    """`python ppo_eval.py RUN --num_envs 256 --capture_video --save_trajectory` on a GPU, through ppo_eval.py's own
    entry point: one RecordEpisode records the trajectories of every env and cuts the tiled video at the time
    limit. The envs are built, then the evaluation stops (they cannot be stepped)."""
    train = run_script("ppo.py", fast_args("PickCube-v1", "pick", num_envs=1, num_eval_envs=1, num_steps=10,
                                           total_timesteps=10, num_minibatches=1, update_epochs=1), tmp_path)
    assert train.returncode == 0, train.stderr
    gpu_sized_envs.clear()
    built = {}

    class Built(Exception):
        pass

    def stop_after_building(agent, envs, *args, **kwargs):
        recorder = envs.video_recorder
        built.update(num_envs=envs.num_envs, recorder_envs=recorder.num_envs, save_video=recorder._save_video,
                     save_trajectory=recorder.save_trajectory, max_steps_per_video=recorder.max_steps_per_video,
                     output_dir=recorder.output_dir)
        raise Built

    monkeypatch.setattr(ppo, "evaluate", stop_after_building)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Built):
        ppo_eval.cli(["runs/pick", "--num_envs", "256", "--num_episodes", "256", "--capture_video", "--save_trajectory",
                      "--output_dir", "out"])
    assert built == dict(num_envs=256, recorder_envs=256, save_video=True, save_trajectory=True, max_steps_per_video=50,
                         output_dir=Path("out/videos"))
    assert gpu_sized_envs[0]["sim_backend"] == "physx_cuda" and gpu_sized_envs[0]["num_envs"] == 256
    # 16 x 16 tiles of 64 pixels: a 1024-pixel frame, where the task's 512-pixel camera would make 8192 pixels
    assert gpu_sized_envs[0]["human_render_camera_configs"] == dict(shader_pack="default", width=64, height=64)
    assert (tmp_path / "out" / "trajectory.h5").is_file()


@pytest.mark.parametrize("flags,mention", [
    (dict(eval_partial_reset=True), "--eval_reconfiguration_freq=0"),
    (dict(reconfiguration_freq=5), "--reconfiguration_freq=0"),
])
@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ippo], ids=["ppo", "ppo_rnn", "ippo"])
def test_gpu_path_refuses_partial_reset_with_reconfiguration(gpu_sized_envs, trainer, flags, mention):
    env_id = "TwoRobotPickCube-v1" if trainer is ippo else "PickCube-v1"
    with pytest.raises(trainer.UserError, match=mention):
        trainer.validate(trainer.Args(env_id=env_id, **flags), maniskill=True, time_limit=50)
    if "eval_partial_reset" in flags:  # ppo_eval.py's evaluation envs of the run
        run = trainer.Args(env_id=env_id, **flags)
        with pytest.raises(ppo_eval.UserError, match="--reconfiguration_freq 0"):
            ppo_eval.validate_run(run, trainer, True, ppo_eval.EvalArgs(checkpoint="unused"))
    # ManiSkill itself refuses the combination only once many envs are built
    args = trainer.Args(env_id=env_id, capture_video=False, **flags)
    evaluation = "eval_partial_reset" in flags
    with pytest.raises(trainer.UserError, match="cannot be reconfigured"):
        trainer.make_envs(args, True, torch.device("cpu"), evaluation=evaluation, run_dir=Path("unused"),
                          num_eval_steps=50)


def test_an_evaluation_that_ends_early_saves_its_video(tmp_path):
    args = ppo.Args(env_id="PickCube-v1", num_eval_envs=1)
    eval_envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=50)
    try:
        agent = ppo.Agent(eval_envs.obs_dim, ppo.space_to_dict(eval_envs.single_action_space), norm_obs=False,
                          norm_value=False, hidden_sizes=(256, 256, 256), activation="tanh", log_std_init=-0.5)
        ppo.evaluate(agent, eval_envs, num_eval_steps=5, seed=0)
        videos = list((tmp_path / "videos").glob("*.mp4"))
        assert len(videos) == 1 and video_frames(videos[0])[0] == 6  # the reset's frame and 5 steps'
    finally:
        eval_envs.close()


@pytest.mark.parametrize("script,env_id", [("ppo.py", "PushCube-v1"), ("ppo_rnn.py", "PushCube-v1"),
                                           ("ippo.py", "TwoRobotPickCube-v1")], ids=["ppo", "ppo_rnn", "ippo"])
def test_evaluation_leaves_training_numbers_alone(tmp_path, script, env_id):
    """ManiSkill draws the starts of unseeded episodes (every evaluation after the first) from torch's global
    generator of the sim device, the one that samples training's actions: how often a run evaluates must not change
    what it trains on."""
    common = dict(num_envs=1, num_eval_envs=1, num_steps=10, num_minibatches=1, update_epochs=1, total_timesteps=40)
    runs = (("often", 1), ("once", 4))
    losses = []
    results = run_scripts([(script, fast_args(env_id, name, eval_freq=eval_freq, **common))
                           for name, eval_freq in runs], tmp_path)  # side by side
    for (name, _), result in zip(runs, results):
        assert result.returncode == 0, result.stderr
        tags = scalars(tmp_path / "runs" / name)
        losses.append({tag: values for tag, values in tags.items() if tag.startswith("losses/")})
    assert losses[0] and losses[0] == losses[1]
