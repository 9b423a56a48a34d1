"""--track with the real wandb client in offline mode (no network): what each wandb run received, read back from its
own log with wandb's reader (`wandb leet inspect`), against the run's TensorBoard log and video files."""

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ppo
import ppo_eval
from tests.util import REPO, fast_args, refused_in_one_line, run_script, scalars, script_env

POINT_MASS = "tests.envs:PointMass-v0"
WANDB = str(Path(sys.executable).parent / "wandb")


def offline(tmp_path: Path) -> dict:
    """wandb offline, its settings and caches in the test's directory."""
    return {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb_data")}


def tracked(script: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    result = run_script(script, argv, tmp_path, timeout=600, extra_env=offline(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def wandb_runs(run_dir: Path) -> list[dict]:
    """Each wandb run that a process started in run_dir (its offline log, oldest first): its run record, and its
    history as {step: {key: value}}."""
    runs = []
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        out = subprocess.run([WANDB, "leet", "inspect", str(log), "--json"], capture_output=True, text=True,
                             check=True).stdout
        records = [json.loads(line) for line in out.splitlines()]
        history = {}
        for record in records:
            if record["type"] == "history":
                history.setdefault(record["history"]["step"]["num"], {}).update(record["history"]["item"])
        run = next((r["run"] for r in records if r["type"] == "run"), None)
        if run is not None:  # else a run killed before wandb's service wrote anything
            runs.append({"run": run, "history": history})
    return runs


def merged_history(runs: list[dict]) -> dict[int, dict]:
    history = {}
    for run in runs:
        for step, items in run["history"].items():
            history.setdefault(step, {}).update(items)
    return history


def assert_same_scalars_as_tensorboard(run_dir: Path, history: dict[int, dict]):
    """Every scalar of the run's TensorBoard log at its step in wandb, and nothing else but videos and global_step."""
    logged = scalars(run_dir)
    in_tensorboard = {(tag, step): value for tag, points in logged.items() for step, value in points}
    assert all(items["global_step"] == step for step, items in history.items())
    in_wandb = {(key, step): value for step, items in history.items() for key, value in items.items()
                if not key.startswith("_") and "video" not in key and key != "global_step"}
    assert in_wandb.keys() == in_tensorboard.keys()
    for key, value in in_tensorboard.items():
        assert in_wandb[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key  # TensorBoard keeps float32


def uploaded(history: dict[int, dict], key: str) -> dict[str, int]:
    """The sha256 of each video logged as key (each once), and its step."""
    found = [(file["sha256"], step) for step, items in history.items() for file in items.get(f"{key}.videos", [])]
    assert len(dict(found)) == len(found), found
    return dict(found)


def sha256s(folder: Path) -> set[str]:
    return {hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.glob("*.mp4")}


def test_each_seed_is_a_wandb_run_that_resume_and_evaluation_continue(tmp_path):
    """--num_seeds 2 --track: a wandb run per seed (named as its run directory, the run its group, its own config),
    with its TensorBoard scalars at their steps and its videos; --resume continues each; ppo_eval.py --track logs to
    the seed's run."""
    argv = fast_args(POINT_MASS, "many", num_seeds=2, track=True, capture_video=True, save_train_video_freq=2,
                     total_timesteps=32 * 4, eval_freq=2) + ["--wandb_tags", "first", "second"]
    tracked("ppo.py", argv, tmp_path)
    tracked("ppo.py", ["--resume", "runs/many", "--total_timesteps", str(32 * 6)], tmp_path)
    run_dir = tmp_path / "runs/many"
    assert not (run_dir / "wandb").exists()  # the seeds' runs alone
    ids = []
    for seed in (1, 2):
        seed_dir = run_dir / f"many__seed{seed}"
        first, resumed = wandb_runs(seed_dir)
        assert first["run"]["run_id"] == resumed["run"]["run_id"] and first["run"]["run_id"].endswith(f"-{seed}")
        ids.append(first["run"]["run_id"])
        for run in (first, resumed):
            assert (run["run"]["display_name"], run["run"]["run_group"]) == (seed_dir.name, "many")
            assert (run["run"]["project"], run["run"]["tags"]) == ("ppo-baselines", ["first", "second"])
            config = run["run"]["config"]["update"]
            assert (config["seed"], config["num_seeds"], config["env_id"]) == (seed, 1, POINT_MASS)
        assert max(first["history"]) == 32 * 4 < min(resumed["history"])  # resumed after its final checkpoint
        history = merged_history([first, resumed])
        assert_same_scalars_as_tensorboard(seed_dir, history)
        eval_steps = {step for step, _ in scalars(seed_dir)["eval/return"]}
        eval_videos = uploaded(history, "eval/video")
        assert eval_videos.keys() == sha256s(seed_dir / "videos") and set(eval_videos.values()) == eval_steps
        assert len(eval_steps) == 3
        # the run's training videos, which show its first envs (the first seed's), go to the first seed's run
        train_videos = uploaded(history, "train/video")
        assert train_videos.keys() == (sha256s(run_dir / "train_videos") if seed == 1 else set())
    assert ids[0] != ids[1] and ids[0][:-2] == ids[1][:-2]  # one run_id, kept by the checkpoints, and the seed

    seed_dir = run_dir / "many__seed2"
    tracked("ppo_eval.py", [str(seed_dir), "--num_episodes", "2", "--num_envs", "1", "--capture_video", "--track",
                            "--output", "results.json", "--output_dir", "evaluation"], tmp_path)
    evaluation = wandb_runs(seed_dir)[-1]
    assert evaluation["run"]["run_id"] == ids[1]
    (items,) = evaluation["history"].values()
    results = json.loads((tmp_path / "results.json").read_text())
    assert items["ppo_eval/global_step"] == 32 * 6
    assert items["ppo_eval/return"] == pytest.approx(results["metrics"]["return"]["mean"])
    assert uploaded(evaluation["history"], "ppo_eval/video").keys() == sha256s(tmp_path / "evaluation/videos")
    lock = ppo.RunDirLock(seed_dir)  # as while the run trains: wandb takes one process's writes to a run
    try:
        tracked("ppo_eval.py", [str(seed_dir), "--num_episodes", "1", "--num_envs", "1", "--track"], tmp_path)
    finally:
        lock.release()
    (evaluation,) = [run for run in wandb_runs(seed_dir) if run["run"]["display_name"] == "many__seed2__eval"]
    assert evaluation["run"]["run_id"] != ids[1]


@pytest.mark.parametrize("script, env_id, extra", [
    ("ppo_rnn.py", POINT_MASS, {"capture_video": True}),
    ("ppo_rgb.py", "tests.envs:PointMassPixels-v0", {"capture_video": True}),
    ("ippo.py", "vmas:tests.vmas_scenarios:Clock", {"max_episode_steps": 16}),
])
def test_every_trainer_tracks_each_seed_and_resumes_its_runs(tmp_path, script, env_id, extra):
    if script == "ippo.py":
        pytest.importorskip("vmas")
    argv = fast_args(env_id, "seeds", num_seeds=2, track=True, **extra) + ["--wandb_group", "mine"]
    tracked(script, argv, tmp_path)
    tracked(script, ["--resume", "runs/seeds", "--total_timesteps", str(32 * 6)], tmp_path)
    for seed in (1, 2):
        seed_dir = tmp_path / f"runs/seeds/seeds__seed{seed}"
        first, resumed = wandb_runs(seed_dir)
        assert first["run"]["run_id"] == resumed["run"]["run_id"]
        for run in (first, resumed):
            assert (run["run"]["display_name"], run["run"]["run_group"]) == (seed_dir.name, "mine")
            assert run["run"]["config"]["update"]["seed"] == seed
        history = merged_history([first, resumed])
        assert_same_scalars_as_tensorboard(seed_dir, history)
        if extra.get("capture_video"):  # the resumed run's videos beside the first's, each uploaded once
            assert uploaded(history, "eval/video").keys() == sha256s(seed_dir / "videos")
            assert len(list((seed_dir / "videos").glob("*.mp4"))) == 3


def test_an_untracked_runs_evaluation_is_a_new_wandb_run(tmp_path):
    assert run_script("ppo.py", fast_args(POINT_MASS, "plain"), tmp_path, timeout=300).returncode == 0
    tracked("ppo_eval.py", ["runs/plain", "--num_episodes", "2", "--num_envs", "1", "--track"], tmp_path)
    (run,) = wandb_runs(tmp_path / "runs/plain")
    assert run["run"]["display_name"] == "plain__eval"
    assert run["run"]["config"]["update"]["env_id"] == POINT_MASS
    (items,) = run["history"].values()
    assert items["ppo_eval/global_step"] == 32 * 4 and "ppo_eval/return" in items


def test_track_without_wandb_or_a_login_is_one_line(tmp_path, capfd, monkeypatch):
    assert run_script("ppo.py", fast_args(POINT_MASS, "plain", total_timesteps=32), tmp_path,
                      timeout=300).returncode == 0
    # no API key and no terminal to ask for one; a mode wandb does not know
    login = {"WANDB_MODE": "online", "WANDB_API_KEY": "", "HOME": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path)}
    for extra_env, says in ((login, "No API key configured"), ({"WANDB_MODE": "offlin"}, "Settings mode")):
        result = run_script("ppo.py", fast_args(POINT_MASS, "online", track=True, num_seeds=2), tmp_path,
                            timeout=300, extra_env=extra_env)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert len(errors) == 1 and errors[0].startswith("error: --track could not start a wandb run"), errors
        assert says in errors[0] and "WANDB_MODE=offline" in errors[0] and not (tmp_path / "runs/online").exists()
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    line = refused_in_one_line(ppo_eval, ["runs/plain", "--track"], tmp_path, capfd, whole_process=False)
    assert "pip install wandb" in line


def test_track_with_wandb_disabled_says_that_nothing_is_tracked(tmp_path):
    result = run_script("ppo.py", fast_args(POINT_MASS, "disabled", track=True, num_seeds=2), tmp_path, timeout=300,
                        extra_env={**offline(tmp_path), "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "nothing is tracked" in line]
    assert said == ["--track: wandb is disabled (WANDB_MODE=disabled or `wandb disabled`): nothing is tracked; the "
                    "TensorBoard logs are written as always"]
    assert scalars(tmp_path / "runs/disabled/disabled__seed2") and not list(tmp_path.rglob("offline-run-*"))
    # resumed with wandb on, each seed's run gets every step, the disabled run's too
    tracked("ppo.py", ["--resume", "runs/disabled", "--total_timesteps", str(32 * 6)], tmp_path)
    for seed in (1, 2):
        seed_dir = tmp_path / f"runs/disabled/disabled__seed{seed}"
        assert_same_scalars_as_tensorboard(seed_dir, merged_history(wandb_runs(seed_dir)))


def test_a_run_killed_outright_gives_wandb_on_resume_every_row_and_video_once(tmp_path):
    """SIGKILL after the run's checkpoint at iteration 8: wandb's service wrote nothing of what the run logged
    (offline). --resume logs first what TensorBoard holds up to the checkpoint, and the videos logged by then, then
    its own: each row and each evaluation's videos reach each seed's wandb run once."""
    argv = [sys.executable, str(REPO / "ppo.py"), *fast_args(POINT_MASS, "killed", track=True, num_seeds=2,
                                                             checkpoint_freq=4, total_timesteps=32 * 16,
                                                             capture_video=True, num_eval_steps=8)]
    env = {**script_env(), **offline(tmp_path)}
    killed = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seeds = [tmp_path / f"runs/killed/killed__seed{seed}" for seed in (1, 2)]
    deadline = time.monotonic() + 300
    while not (tmp_path / "runs/killed/ckpt_8.pt").exists():  # the run's, after its seeds' (--resume's choice)
        assert killed.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    killed.kill()
    killed.wait()
    tracked("ppo.py", ["--resume", "runs/killed"], tmp_path)
    for seed_dir in seeds:
        history = merged_history(wandb_runs(seed_dir))
        assert_same_scalars_as_tensorboard(seed_dir, history)
        # every evaluation's video reaches wandb once, at its step: the killed run's, logged by its checkpoint, and
        # the resumed run's
        assert all((seed_dir / f"videos/{run}-episode-0.mp4").is_file() for run in ("eval", "eval2"))
        videos = uploaded(history, "eval/video")
        assert videos.keys() == sha256s(seed_dir / "videos")
        assert sorted(videos.values()) == [64 * i for i in range(1, 9)]
