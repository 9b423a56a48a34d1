"""The benchmark scripts in tiny configurations, so that they keep working (their real runs are in README.md)."""

import subprocess
import sys

from tests.util import REPO, script_env


def run(command: list[str], cwd, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env={**script_env(), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=900)


def test_mujoco_benchmark_writes_its_table_and_plots(tmp_path):
    result = run(["bash", str(REPO / "benchmarks/mujoco.sh"), "2048", "1", "2"], tmp_path,
                 {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "out/table.md").read_text().splitlines()
    assert table[1].startswith("seeds: 1; command: ppo.py --hidden_sizes 64 64 ")
    assert table[4].startswith("| runs | n | eval/return (final) | charts/SPS (final) |")
    assert [row.split(" | ")[0] for row in table[6:]] == [f"| mujoco__env_id={task}" for task in
                                                           ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")]
    for task in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"):
        assert (tmp_path / "out" / task / "eval_return.png").stat().st_size > 10_000
        assert (tmp_path / "runs" / f"mujoco__env_id={task}__seed1" / "final_ckpt.pt").exists()


def test_speed_benchmark_prints_its_table(tmp_path):
    result = run([sys.executable, str(REPO / "benchmarks/speed_cleanrl_settings.py"), "--total_timesteps", "4096",
                  "--variants", "small", "--raw_steps", "500"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("HalfCheetah-v4, 4096 steps; raw env, random actions:")
    assert lines[-1].startswith("| ppo.py | 64 64 | ")


def test_pushcube_throughput_benchmark_prints_its_table(tmp_path):
    result = run([sys.executable, str(REPO / "benchmarks/sps_pushcube.py"), "--num_envs", "1", "--steps", "20",
                  "--iterations", "2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("| 1 | ")
