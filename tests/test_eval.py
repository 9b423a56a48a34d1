"""ppo_eval.py: exact episode counting, agreement with each trainer's own evaluation, statistics, videos and
trajectories, seeding, safe loading and bad input."""

import contextlib
import dataclasses
import importlib
import json
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import ppo_eval
from tests.util import fast_args, load, run_script, scalars, video_frames

EPISODE_IDS = "tests.envs:EpisodeIds-v0"


def train(tmp_path: Path, script: str, argv: list[str]):
    """A short run of the trainer, its cli() in this process from tmp_path: a process of its own would add a start
    of torch and the simulators to each test."""
    with contextlib.chdir(tmp_path):
        assert importlib.import_module(Path(script).stem).cli(argv) == 0


def evaluate(tmp_path: Path, argv: list[str], output: str = "results.json") -> dict:
    """ppo_eval.py's cli() in this process from tmp_path, and the JSON it wrote. (In a process of its own, as a user
    runs it: test_help_lists_every_flag, test_bad_checkpoints_are_one_clear_line and tests/test_copy.py.)"""
    with contextlib.chdir(tmp_path):
        assert ppo_eval.cli(argv + ["--output", output]) == 0
    return json.loads((tmp_path / output).read_text())


def final_eval(run_dir: Path) -> dict[str, float]:
    """The trainer's last evaluation, as it logged it."""
    return {tag[len("eval/"):]: values[-1][1] for tag, values in scalars(run_dir).items() if tag.startswith("eval/")}


def assert_agrees_with_training(results: dict, run_dir: Path):
    logged = final_eval(run_dir)
    assert logged.pop("episodes") == results["evaluation"]["num_episodes"]
    assert set(logged) == set(results["metrics"]), (logged, results["metrics"])
    for key, value in logged.items():
        row = results["metrics"][key]
        assert ((row["rate"] if row["interval"] == "wilson" else row["mean"])
                == pytest.approx(value, rel=1e-6, abs=1e-6)), key


@pytest.mark.parametrize("script,extra", [("ppo.py", []), ("ppo_rnn.py", ["--rnn_hidden_size", "8"])],
                         ids=["ppo", "ppo_rnn"])
def test_every_requested_episode_counts_once(tmp_path, script, extra):
    """11 episodes on 4 envs whose episodes last 1 to 4 steps: envs 0-2 play their first 3 episodes, env 3 its first 2,
    and the episodes they play on meanwhile are not counted. EpisodeIds' returns name the counted episodes."""
    train(tmp_path, script, fast_args(EPISODE_IDS, "ids", total_timesteps=32) + extra)
    results = evaluate(tmp_path, ["runs/ids", "--num_episodes", "11", "--num_envs", "4", "--seed", "5"])
    expected = [(name * 100 + k, 1 + (name + k) % 4) for name, quota in zip((5, 6, 7, 8), (3, 3, 3, 2))
                for k in range(quota)]
    assert sorted((e["return"], e["episode_len"]) for e in results["episodes"]) == sorted(expected)
    assert results["evaluation"]["episodes_per_env"] == [3, 3, 3, 2]
    assert results["metrics"]["return"]["episodes"] == 11


def test_help_lists_every_flag(tmp_path):
    result = run_script("ppo_eval.py", ["--help"], tmp_path)
    assert result.returncode == 0 and "CHECKPOINT" in result.stdout
    for field in dataclasses.fields(ppo_eval.EvalArgs)[1:]:
        assert f"--{field.name}" in result.stdout, field.name


def test_wilson_interval_against_published_values():
    """Newcombe (1998), Statistics in Medicine 17:857-872, Table I, method 3 (score interval without correction)."""
    for successes, n, expected in [(81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)), (0, 20, (0.0, 0.1611)),
                                   (1, 29, (0.0061, 0.1718)), (29, 29, (0.8830, 1.0))]:
        low, high = ppo_eval.wilson_interval(successes, n)
        assert (round(low, 4), round(high, 4)) == expected, (successes, n)


def test_bootstrap_interval_covers_the_mean_and_narrows():
    rng = torch.Generator().manual_seed(0)
    values = torch.randn(400, generator=rng, dtype=torch.float64).numpy()
    low, high = ppo_eval.bootstrap_interval(values, 4000, ppo_eval.np.random.default_rng(0))
    standard_error = values.std(ddof=1) / 20
    assert low < values.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * standard_error, rel=0.1)  # the normal interval, for n = 400
    low_few, high_few = ppo_eval.bootstrap_interval(values[:25], 4000, ppo_eval.np.random.default_rng(0))
    assert high_few - low_few > 2 * (high - low)


def test_ppo_rnn_round_trip_seeded_and_stochastic(tmp_path):
    """CartPole's starts depend on the seed: the evaluator replays the trainer's final evaluation exactly (same seed,
    envs and episodes), the same command gives the same numbers, and sampled actions change them."""
    train(tmp_path, "ppo_rnn.py", fast_args("CartPole-v1", "rnn", total_timesteps=64, eval_freq=100, num_eval_envs=3,
                                            rnn_hidden_size=16))
    # The run's only evaluation is its final one, seeded with seed + num_envs = 1 + 2.
    replay = ["runs/rnn", "--num_episodes", "3", "--num_envs", "3", "--seed", "3"]
    results = evaluate(tmp_path, replay)
    assert_agrees_with_training(results, tmp_path / "runs/rnn")
    ckpt = results["checkpoint"]
    assert ckpt["trainer"] == "ppo_rnn" and ckpt["iteration"] == 2 and ckpt["global_step"] == 64
    assert ckpt["path"] == str((tmp_path / "runs/rnn/final_ckpt.pt").resolve()) and len(ckpt["sha256"]) == 64
    assert results["seeds"]["env_reset"] == 3 and results["evaluation"]["deterministic"] is True
    for row in results["episodes"]:
        assert isinstance(row["return"], float) and isinstance(row["episode_len"], int)
    for key in ("mean", "std", "median"):
        assert isinstance(results["metrics"]["return"][key], float)

    stochastic = ["runs/rnn", "--num_episodes", "6", "--num_envs", "2", "--stochastic"]
    first, second = evaluate(tmp_path, stochastic, "a.json"), evaluate(tmp_path, stochastic, "b.json")
    assert first["episodes"] == second["episodes"] and first["metrics"] == second["metrics"]
    deterministic = evaluate(tmp_path, stochastic[:-1], "c.json")
    assert first["episodes"] != deterministic["episodes"] and first["evaluation"]["deterministic"] is False


def test_ippo_round_trip_per_agent(tmp_path):
    """VMAS navigation's starts depend on the seed; the evaluator reports each agent's return as the trainer did."""
    train(tmp_path, "ippo.py", fast_args("vmas:navigation", "nav", total_timesteps=64, eval_freq=100, num_eval_envs=4,
                                         max_episode_steps=16) + ["--env_kwargs", "n_agents=2"])
    results = evaluate(tmp_path, ["runs/nav", "--num_episodes", "4", "--num_envs", "4", "--seed", "3"])
    assert_agrees_with_training(results, tmp_path / "runs/nav")
    assert {"agent_0/return", "agent_1/return"} <= set(results["metrics"])
    assert results["checkpoint"]["agents"] == ["agent_0", "agent_1"]
    for row in results["episodes"]:
        assert row["return"] == pytest.approx((row["agent_0/return"] + row["agent_1/return"]) / 2, rel=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_maniskill_round_trip_video_and_trajectory(tmp_path):
    """PickCube on the CPU simulation through ManiSkillVectorEnv: success rates as the trainer's evaluation reports
    them, videos and RecordEpisode trajectories of exactly the evaluated episodes."""
    pytest.importorskip("mani_skill")
    train(tmp_path, "ppo.py", fast_args("PickCube-v1", "pick", num_envs=1, num_eval_envs=1, num_steps=10,
                                        total_timesteps=10, num_minibatches=1, update_epochs=1))
    results = evaluate(tmp_path, ["runs/pick", "--num_episodes", "1", "--num_envs", "1", "--seed", "2"])
    assert_agrees_with_training(results, tmp_path / "runs/pick")
    assert {"success_once", "success_at_end"} <= set(results["metrics"])
    assert results["metrics"]["success_once"]["interval"] == "wilson"
    assert isinstance(results["episodes"][0]["success_once"], bool)

    out = tmp_path / "out"
    recorded = evaluate(tmp_path, ["runs/pick", "--num_episodes", "2", "--num_envs", "1", "--capture_video",
                                   "--save_trajectory", "--output_dir", "out"], "recorded.json")
    videos = sorted((out / "videos").glob("*.mp4"))
    assert len(videos) == 2 and all(video_frames(v)[0] == 51 for v in videos)  # the reset's frame and 50 steps'
    trajectories = json.loads((out / "trajectory.json").read_text())
    assert [e["elapsed_steps"] for e in trajectories["episodes"]] == [50, 50]
    assert [bool(e["success"]) for e in trajectories["episodes"]] == [e["success_at_end"] for e in recorded["episodes"]]
    import h5py

    with h5py.File(out / "trajectory.h5") as h5:
        assert sorted(h5) == ["traj_0", "traj_1"] and h5["traj_0/actions"].shape == (50, 8)


def evil_pickle(path: Path, marker: Path, torch_format: bool = True):
    """A checkpoint-shaped file whose loading with pickle would create marker."""
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    state = {"format": 2, "trainer": "ppo", "model": Payload()}
    if torch_format:
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state, protocol=2))  # the protocol torch.load reads


def test_bad_checkpoints_are_one_clear_line(tmp_path, monkeypatch, capfd):
    """Nothing in a checkpoint runs; a missing, empty, truncated, corrupt or foreign file is one error line."""
    train(tmp_path, "ppo.py", fast_args(EPISODE_IDS, "ids", total_timesteps=32))
    capfd.readouterr()  # the run's progress bar
    good = (tmp_path / "runs/ids/final_ckpt.pt").read_bytes()
    marker = tmp_path / "pwned"
    evil_pickle(tmp_path / "evil.pt", marker)
    evil_pickle(tmp_path / "evil.pkl", marker, torch_format=False)
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "truncated.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint" * 64)
    ckpt = load(tmp_path / "runs/ids/final_ckpt.pt")
    torch.save({**ckpt, "trainer": "sac"}, tmp_path / "sac.pt")
    torch.save({**ckpt, "trainer": "../evil/ppo"}, tmp_path / "path.pt")
    (tmp_path / "setup.py").write_text(f"open({str(marker)!r}, 'w').close()\n")  # no trainer: must not run
    torch.save({**ckpt, "trainer": "setup"}, tmp_path / "setup.pt")
    torch.save({**ckpt, "trainer": "pomdp"}, tmp_path / "pomdp.pt")  # pomdp.py lies beside ppo_eval.py
    torch.save({**ckpt, "format": 1}, tmp_path / "old.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.mp4").write_bytes(b"x")
    cases = [
        (["evil.pt"], "could run code"),
        (["evil.pkl"], "could run code"),
        (["missing.pt"], "does not exist"),
        (["empty.pt"], "is empty"),
        (["truncated.pt"], "cannot be read"),
        (["garbage.pt"], "cannot be read"),
        (["sac.pt"], "written by sac.py, which is neither beside ppo_eval.py nor in the working directory"),
        (["path.pt"], "not a Python file name"),
        (["setup.pt"], "is not a trainer file"),
        (["pomdp.pt"], "is not a trainer file"),
        (["runs/ids", "--trainer", "elsewhere/ppo_rnn.py"], "written by ppo.py, not by --trainer elsewhere/ppo_rnn.py"),
        (["runs/ids", "--trainer", "elsewhere/ppo.py"], "--trainer elsewhere/ppo.py does not exist"),
        (["runs/ids", "--trainer", "elsewhere/ppo.py", "--run_trainer"], "--trainer with another: give one"),
        (["old.pt"], "format 1"),
        (["foreign.pt"], "not a checkpoint of these trainers"),
        (["empty_run"], "holds no checkpoint"),
        (["runs/ids", "--env_id", "CartPole-v1"], "do not match CartPole-v1's"),
        (["runs/ids", "--save_trajectory"], "not a ManiSkill task"),
        (["runs/ids", "--capture_video", "--output_dir", "full"], "pass another --output_dir"),
        (["runs/ids", "--num_episodes", "0"], "--num_episodes must be positive"),
        (["runs/ids", "--num_envs", "0"], "--num_envs must be positive"),
        (["runs/ids", "--seed", "-1"], "--seed must be in"),
        (["runs/ids", "--max_episode_steps", "0"], "--max_episode_steps must be positive"),
        (["runs/ids", "--output", "runs"], "is a directory"),
        (["runs/ids", "--output", "/proc/nope/results.json"], "cannot be written"),  # before evaluating
        (["runs/ids", "--export", "/proc/nope/policy.onnx"], "--export /proc/nope/policy.onnx cannot be written"),
    ]
    # Two cases take the whole way of a process (its exit status, nothing else on stderr); the others call the same
    # cli() in this process, which saves a start of torch and the simulators each.
    whole_way = (["evil.pt"], ["runs/ids", "--num_episodes", "0"])
    with ThreadPoolExecutor(max_workers=2) as pool:  # independent processes: two at a time, one per core
        processes = dict(zip(map(tuple, whole_way),
                             pool.map(lambda argv: run_script("ppo_eval.py", argv, tmp_path, timeout=120), whole_way)))
    monkeypatch.chdir(tmp_path)
    for argv, mentions in cases:
        if tuple(argv) in processes:
            returncode, stderr = processes[tuple(argv)].returncode, processes[tuple(argv)].stderr
        else:
            returncode, stderr = ppo_eval.cli(argv), capfd.readouterr().err
        assert returncode == 2, (argv, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and mentions in lines[0], (argv, stderr)
    assert not marker.exists()
    assert (tmp_path / "full" / "keep.mp4").read_bytes() == b"x"
    # no eval/ left behind; source/ is the run's own
    assert sorted(p.name for p in (tmp_path / "runs/ids").iterdir() if p.is_dir()) == ["source"]

    # A shorter time limit than the task's reaches the env: EpisodeIds' 3- and 4-step episodes are truncated at 2.
    shorter = evaluate(tmp_path, ["runs/ids", "--num_episodes", "8", "--num_envs", "4", "--max_episode_steps", "2"])
    assert shorter["evaluation"]["max_episode_steps"] == 2
    assert sorted({e["episode_len"] for e in shorter["episodes"]}) == [1, 2]


def test_a_num_seeds_run_points_at_its_seeds_runs(tmp_path, monkeypatch, capfd):
    """The run's checkpoints hold no seed's weights: its directory, as its checkpoint files, is one line naming the
    seeds' runs in it, and a seed's run replays that seed's final evaluation."""
    train(tmp_path, "ppo.py", fast_args("CartPole-v1", "batch", total_timesteps=64, eval_freq=100, num_eval_envs=3)
          + ["--num_seeds", "2"])
    capfd.readouterr()  # the run's progress bar
    monkeypatch.chdir(tmp_path)
    for given in ("runs/batch", "runs/batch/", "runs/batch/ckpt_2.pt"):
        assert ppo_eval.cli([given]) == 2
        lines = capfd.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(
            "evaluate a seed's run, runs/batch/batch__seed1 to runs/batch/batch__seed2"), (given, lines)
    # seed 2's only evaluation was its final one, seeded with seed + num_envs = 2 + 2
    results = evaluate(tmp_path, ["runs/batch/batch__seed2", "--num_episodes", "3", "--num_envs", "3", "--seed", "4"])
    assert_agrees_with_training(results, tmp_path / "runs/batch/batch__seed2")


def test_trainers_refuse_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    evil_pickle(tmp_path / "evil.pt", marker)
    for script in ("ppo.py", "ippo.py"):  # ppo_rnn.py's and ppo_rgb.py's main and load_checkpoint: checked copies
        result = run_script(script, ["--checkpoint", "evil.pt", "--env_id", EPISODE_IDS if script != "ippo.py"
                                     else "vmas:navigation", "--no_capture_video"], tmp_path, timeout=120)
        assert result.returncode == 2 and "could run code" in result.stderr, (script, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not marker.exists()


def test_a_trainer_that_fails_to_import_leaves_nothing_behind(tmp_path):
    """A copy whose import fails (its own bug: the traceback is the user's to read) is not left half-imported in
    sys.modules, nor its folder on sys.path, for a later import in the same process."""
    broken = tmp_path / "broken_idea.py"
    broken.write_text("from pathlib import Path\nTRAINER = Path(__file__).stem\nCHECKPOINT_FORMAT = 2\n"
                      "def make_agent(): pass\ndef evaluate(): pass\nraise ImportError('a bug of the copy')\n")
    with pytest.raises(ImportError, match="a bug of the copy"):
        ppo_eval.import_trainer("broken_idea", tmp_path / "ckpt.pt", str(broken))
    assert "broken_idea" not in ppo_eval.sys.modules and str(tmp_path) not in ppo_eval.sys.path


@pytest.mark.parametrize("trainer,env_id", [("ppo", "PickCube-v1"), ("ippo", "TwoRobotPickCube-v1")])
def test_no_cuda_keeps_maniskill_off_the_gpu(tmp_path, monkeypatch, trainer, env_id):
    """ppo_eval.py --no_cuda on a machine with CUDA: the policy, ManiSkill's simulation and its renderer run on the
    CPU, whatever the run's --sim_backend=auto would pick there. (ppo_rnn.py's make_envs: a checked copy of
    ppo.py's.)"""
    pytest.importorskip("mani_skill")
    import gymnasium as gym

    trainer = importlib.import_module(trainer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ckpt = {"args": dataclasses.asdict(trainer.Args(env_id=env_id, sim_backend="auto"))}
    args = ppo_eval.EvalArgs(checkpoint="unused", cuda=False, num_envs=1)
    run = ppo_eval.run_args(trainer, ckpt, args)
    assert ppo_eval.validate_run(run, trainer, True, args) == "cpu"
    asked, real_make = [], gym.make
    monkeypatch.setattr(gym, "make", lambda env_id, **kwargs: asked.append(kwargs) or real_make(env_id, **kwargs))
    trainer.make_envs(run, True, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=50).close()
    assert asked[0]["sim_backend"] == "physx_cpu" and asked[0]["render_backend"] == "cpu"
    with pytest.raises(ppo_eval.UserError, match="--no_cuda"):
        ppo_eval.run_args(trainer, ckpt, dataclasses.replace(args, sim_backend="gpu"))
