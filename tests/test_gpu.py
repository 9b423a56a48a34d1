"""What only a machine with CUDA can run: every trainer and the evaluator on ManiSkill's GPU simulation with video,
--compile, torchrun with NCCL, a GPU run's checkpoint continued on the CPU, the torch-native path on CUDA with its
host syncs counted by CUDA's sync debug mode. `pytest -m gpu`; skipped elsewhere. The
tests of the GPU simulation skip, saying why, where PhysX's GPU library is missing (benchmarks/gpu_simulation.py):
SAPIEN would download it, which a machine without network cannot. benchmarks/gpu.sh runs these and the GPU
benchmarks in one command."""

import json

import pytest
import torch

from benchmarks.gpu_simulation import missing
from tests.test_reliability import run_torchrun
from tests.util import REPO, fast_args, load, run_script, scalars, video_frames

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GPU_SIMULATION_MISSING = missing() if torch.cuda.is_available() else None  # imports SAPIEN: only where it matters
needs_gpu_simulation = pytest.mark.skipif(GPU_SIMULATION_MISSING is not None,
                                          reason=f"needs ManiSkill's GPU simulation: {GPU_SIMULATION_MISSING}")

TRAINERS = {"ppo": "PushCube-v1", "ppo_rnn": "PushCube-v1", "ippo": "TwoRobotPickCube-v1", "ppo_rgb": "PushCube-v1"}
# 16 GPU envs, 3 iterations of 10 steps, an evaluation with video after each: PushCube's episodes last 50 steps,
# TwoRobotPickCube's 100.
GPU_RUN = dict(num_envs=16, num_eval_envs=16, num_steps=10, num_minibatches=4, update_epochs=2, total_timesteps=480,
               eval_freq=1)


def gpu_args(trainer: str, name: str, **overrides) -> list[str]:
    return fast_args(TRAINERS[trainer], name, **{**GPU_RUN, **overrides})


@needs_gpu_simulation
@pytest.mark.parametrize("trainer", TRAINERS)
def test_trains_and_evaluates_on_the_gpu_simulation_with_video(tmp_path, trainer):
    result = run_script(f"{trainer}.py", gpu_args(trainer, "gpu", capture_video=True), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "device=cuda" in result.stdout
    run = tmp_path / "runs/gpu"
    tags = scalars(run)
    assert [value for _, value in tags["eval/episodes"]] == [16.0] * 3 and "eval/success_once" in tags
    episode_len = tags["eval/episode_len"][0][1]
    videos = sorted((run / "videos").glob("*.mp4"))
    assert len(videos) == 3
    for video in videos:  # 16 envs tiled 4 x 4 at 256 pixels: a frame per step, at most about 1024 pixels wide
        frames, (width, height) = video_frames(video)
        assert frames >= episode_len and width <= 1040 and height <= 1040, (video, frames, width, height)
    evaluated = run_script("ppo_eval.py", ["runs/gpu", "--num_envs", "16", "--num_episodes", "16", "--capture_video",
                                           "--output", "results.json"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["evaluation"]["sim_backend"] == "gpu" and results["evaluation"]["device"].startswith("cuda")
    assert len(results["episodes"]) == 16


@needs_gpu_simulation
@pytest.mark.parametrize("trainer", ["ppo", "ippo"])
def test_seeds_share_one_gpu_simulation(tmp_path, trainer):
    """--num_seeds 2: 2 x 16 envs in one simulation; each seed's run evaluates its own 16 envs."""
    result = run_script(f"{trainer}.py", gpu_args(trainer, "seeds", num_seeds=2), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in (1, 2):
        run = tmp_path / f"runs/seeds/seeds__seed{seed}"
        assert [value for _, value in scalars(run)["eval/episodes"]] == [16.0] * 3
        assert load(run / "final_ckpt.pt")["args"]["seed"] == seed


@pytest.mark.parametrize("trainer, env_id, more", [
    ("ppo", "Pendulum-v1", {}), ("ppo_rnn", "Pendulum-v1", {"seq_len": 8}),
    ("ppo_rgb", "tests.envs:PointMassPixels-v0", {"aug_shift": 4}),
    ("ippo", "vmas:tests.vmas_scenarios:Clock", {"max_episode_steps": 16})])
def test_seeds_train_on_cuda(tmp_path, trainer, env_id, more):
    """--num_seeds 2 with the learner on CUDA and a Gymnasium env (ppo_rnn.py's stacked LSTM moved to the GPU, whose
    cuDNN weights cannot hold stacked ones; ppo_rgb.py's stacked convolutions and its shifts drawn from each seed's
    CUDA generator; ippo.py's seeds' VMAS envs on CUDA, each its own stream): each seed's run trains, evaluates and
    saves as a run of its own."""
    result = run_script(f"{trainer}.py", fast_args(env_id, "seeds", num_seeds=2, total_timesteps=32 * 3, **more),
                        tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in (1, 2):
        checkpoint = load(tmp_path / f"runs/seeds/seeds__seed{seed}/final_ckpt.pt")
        assert checkpoint["args"]["seed"] == seed
        assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())


@needs_gpu_simulation
@pytest.mark.parametrize("trainer", TRAINERS)
def test_compile_on_the_gpu(tmp_path, trainer):
    result = run_script(f"{trainer}.py", gpu_args(trainer, "compiled", compile=True, eval_freq=3), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: --compile" not in result.stderr  # compiled, not fallen back to eager


@needs_gpu_simulation
@pytest.mark.parametrize("trainer", TRAINERS)
def test_torchrun_on_the_gpus(tmp_path, trainer):
    """NCCL needs a GPU for each rank: with one GPU, torchrun starts one process, which needs no process group."""
    ranks = min(2, torch.cuda.device_count())
    command = [str(REPO / f"{trainer}.py"), *gpu_args(trainer, "dp", eval_freq=3)]
    result = run_torchrun(command, tmp_path, nproc=ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"world_size={ranks}" in result.stdout
    assert load(tmp_path / "runs/dp/final_ckpt.pt")["world_size"] == ranks


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_gpu_run_continues_on_the_cpu(tmp_path, trainer):
    """A run whose learner trained on the GPU resumes with the learner on the CPU (one env of ManiSkill's CPU
    simulation, stepped in the learner's process)."""
    flags = dict(num_envs=1, num_eval_envs=1, num_minibatches=1)
    result = run_script(f"{trainer}.py", gpu_args(trainer, "moved", sim_backend="cpu", **flags,
                                                  total_timesteps=20), tmp_path)
    assert result.returncode == 0 and "device=cuda" in result.stdout, result.stderr[-3000:]
    resumed = run_script(f"{trainer}.py", ["--resume", "runs/moved", "--total_timesteps", "40", "--no_cuda"], tmp_path)
    assert resumed.returncode == 0 and "device=cpu" in resumed.stdout, resumed.stderr[-3000:]
    assert load(tmp_path / "runs/moved/final_ckpt.pt")["iteration"] == 4


TORCH_ENVS = {"ppo": "tests.envs:CartPoleTorch-v1", "ppo_rnn": "tests.envs:CartPoleTorch-v1",
              "ppo_rgb": "tests.envs:PointMassPixelsTorch-v0"}


@pytest.mark.parametrize("trainer", TORCH_ENVS)
def test_a_torch_env_trains_on_cuda_and_its_rollouts_wait_only_at_their_end(tmp_path, monkeypatch, trainer):
    """The torch-native path on CUDA, env and learner on the GPU: CUDA's sync debug mode reports, in each rollout,
    the boolean-mask reads of its finished episodes after the last step (return and length) and nothing else."""
    module = __import__(trainer)
    syncs, rollout = [], module.rollout

    def watched_rollout(*args, **kwargs):
        with pytest.warns() as caught:
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = rollout(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # not the warning that the debug mode is a prototype, which the first call in a process gives
        syncs.append(sum("called a synchronizing CUDA operation" in str(warning.message) for warning in caught))
        return result

    monkeypatch.setattr(module, "rollout", watched_rollout)
    monkeypatch.chdir(tmp_path)
    flags = dict(num_envs=64, num_steps=32, total_timesteps=64 * 32 * 3, max_episode_steps=16, norm_obs=True,
                 norm_reward=True, **({"seq_len": 8} if trainer == "ppo_rnn" else {}))
    assert module.cli(fast_args(TORCH_ENVS[trainer], "cuda", **flags)) == 0
    assert syncs == [2, 2, 2]
    assert load(tmp_path / "runs/cuda/final_ckpt.pt")["args"]["cuda"]
