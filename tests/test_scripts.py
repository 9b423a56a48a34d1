"""scripts/sweep.sh, scripts/summarize.py and scripts/plot.py on real (tiny) runs."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.util import REPO, fast_args, load, run_python, scalars, script_env

sys.path.insert(0, str(REPO / "scripts"))
import plot  # noqa: E402


def sweep(tmp_path, *options):
    argv = fast_args("Pendulum-v1", "unused")
    del argv[argv.index("--exp_name"):argv.index("--exp_name") + 2]  # the sweep names each run
    command = [sys.executable, str(REPO / "ppo.py"), *argv]
    return subprocess.run(["bash", str(REPO / "scripts/sweep.sh"), *options, "pend", "--", *command], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=600)


def run_tool(tmp_path, script, *args):
    return run_python([str(REPO / "scripts" / script), *map(str, args)], tmp_path, timeout=300)


def test_sweep_runs_every_combination_then_finishes_what_is_missing(tmp_path):
    first = sweep(tmp_path, "--seeds", "1 2", "--vary", "--learning_rate=1e-3 --learning_rate=3e-4", "--jobs", "2")
    assert first.returncode == 0, first.stderr
    names = [f"pend__learning_rate={lr}__seed{seed}" for lr in ("1e-3", "3e-4") for seed in (1, 2)]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == names
    for name in names:
        assert (tmp_path / "runs" / name / "final_ckpt.pt").exists()
    # seeds and flag values reached the runs
    saved = load(tmp_path / "runs" / names[3] / "final_ckpt.pt")["args"]
    assert saved["seed"] == 2 and saved["learning_rate"] == 3e-4

    for checkpoint in ("ckpt_4.pt", "final_ckpt.pt"):  # as if that run had been killed after ckpt_2.pt
        (tmp_path / "runs" / names[0] / checkpoint).unlink()
    for checkpoint in (tmp_path / "runs" / names[1]).glob("*.pt"):  # killed before its first checkpoint
        checkpoint.unlink()
    again = sweep(tmp_path, "--seeds", "1 2", "--vary", "--learning_rate=1e-3 --learning_rate=3e-4")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done already") == 2 and f"resuming: runs/{names[0]}" in again.stdout
    assert f"starting: runs/{names[1]}" in again.stdout
    for name in names[:2]:
        assert (tmp_path / "runs" / name / "final_ckpt.pt").exists()

    # the table: final eval/return of each pair of seeds, mean ± std; sweep.sh's example takes the run directories
    table = subprocess.run(f"{sys.executable} {REPO}/scripts/summarize.py runs/pend__*/", shell=True, cwd=tmp_path,
                           env=script_env(), capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.strip().splitlines()
    assert rows[0].startswith("| runs | n | eval/return (final) |") and len(rows) == 4
    finals = {lr: [scalars(tmp_path / "runs" / f"pend__learning_rate={lr}__seed{seed}")["eval/return"][-1][1]
                   for seed in (1, 2)] for lr in ("1e-3", "3e-4")}
    for row, (lr, values) in zip(rows[2:], finals.items()):
        assert row.startswith(f"| pend__learning_rate={lr} | 2 | {np.mean(values):.4g} ± {np.std(values):.3g} | 128 |")
    by_run = run_tool(tmp_path, "summarize.py", *[f"runs/{name}" for name in names], "--by_run")
    rows = by_run.stdout.strip().splitlines()
    assert rows[0] == "| runs | n | eval/return (final) | eval/return by run | global step | wall time (min) |"
    for row, values in zip(rows[2:], finals.values()):
        assert row.split(" | ")[3] == ", ".join(f"{value:.4g}" for value in values)

    pictures = run_tool(tmp_path, "plot.py", *[f"runs/{name}" for name in names], "--metrics", "eval/return",
                        "charts/SPS", "--out", "plots")
    assert pictures.returncode == 0, pictures.stderr
    for name in ("eval_return.png", "charts_SPS.png"):
        png = (tmp_path / "plots" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000

    missing = run_tool(tmp_path, "plot.py", f"runs/{names[0]}", "--metrics", "eval/nothing")
    assert (missing.returncode == 2
            and missing.stderr.strip().splitlines()[-1].startswith("error: no run logged 'eval/nothing'"))
    unmatched = run_tool(tmp_path, "summarize.py", f"runs/{names[0]}", "--group", "^cheetah")
    assert unmatched.returncode == 2 and "does not match the run name" in unmatched.stderr


def test_sweep_puts_each_combinations_seeds_in_one_process(tmp_path):
    options = ("--seeds", "3 4", "--vary", "--learning_rate=1e-3 --learning_rate=3e-4", "--one_process")
    first = sweep(tmp_path, *options)
    assert first.returncode == 0, first.stderr
    for lr in ("1e-3", "3e-4"):
        run = tmp_path / "runs" / f"pend__learning_rate={lr}__seeds3-4"
        assert load(run / "final_ckpt.pt")["args"]["num_seeds"] == 2
        for seed in (3, 4):
            saved = load(run / f"{run.name}__seed{seed}" / "final_ckpt.pt")["args"]
            assert saved["seed"] == seed and saved["learning_rate"] == float(lr)

    # the commands it prints take each combination's run as its two seeds' runs
    printed = dict(line.split(": ", 1) for line in first.stdout.splitlines() if line.startswith(("table:", "curves:")))
    table, curves = (subprocess.run(printed[key].strip(), shell=True, cwd=tmp_path, env=script_env(),
                                    capture_output=True, text=True, timeout=300) for key in ("table", "curves"))
    assert table.returncode == 0 and curves.returncode == 0, table.stderr + curves.stderr
    rows = table.stdout.strip().splitlines()
    assert len(rows) == 4, rows
    for row, lr in zip(rows[2:], ("1e-3", "3e-4")):
        run = tmp_path / "runs" / f"pend__learning_rate={lr}__seeds3-4"
        finals = [scalars(run / f"{run.name}__seed{seed}")["eval/return"][-1][1] for seed in (3, 4)]
        assert row.startswith(f"| {run.name} | 2 | {np.mean(finals):.4g} ± {np.std(finals):.3g} | 128 |"), row
    assert (tmp_path / "plots/pend/eval_return.png").read_bytes().startswith(b"\x89PNG")
    again = sweep(tmp_path, *options)
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stderr
    other_seeds = sweep(tmp_path, "--seeds", "5 6", "--one_process")  # another batch, not the one done already
    assert other_seeds.returncode == 0 and "starting: runs/pend__seeds5-6" in other_seeds.stdout, other_seeds.stderr
    gap = sweep(tmp_path, "--seeds", "1 3", "--one_process")
    assert gap.returncode == 2 and "--one_process needs consecutive seeds, not 1 3" in gap.stderr


def test_sweep_reports_failed_runs(tmp_path):
    failed = sweep(tmp_path, "--seeds", "1", "--vary", "--learning_rate=-1")
    assert failed.returncode == 1 and "1 run(s) failed" in failed.stderr
    assert "error:" in (tmp_path / "runs/pend__learning_rate=-1__seed1.log").read_text()


@pytest.mark.parametrize("options,says", [
    (["--jobs", "0", "pend", "--", "true"], "error: --jobs must be a positive integer, not 0"),
    (["--vary", "--learning_rate 1e-3", "pend", "--", "true"],
     "error: --vary takes --flag=value words, not --learning_rate"),
    (["--bogus", "pend", "--", "true"], "error: unknown option --bogus"),
    (["pend", "true"], "usage: "),
    (["--seeds"], "usage: "),
])
def test_sweep_refuses_bad_options_before_running_anything(tmp_path, options, says):
    refused = subprocess.run(["bash", str(REPO / "scripts/sweep.sh"), *options], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith(says), refused.stderr
    assert not (tmp_path / "runs").exists()


def test_a_num_seeds_run_stands_for_its_seeds_runs(tmp_path, monkeypatch):
    batch, plain = tmp_path / "b", tmp_path / "plain"
    for path in ("b/b__seed10", "b/b__seed2", "b/b__seed1", "b/source", "b/other__seed3", "plain/source"):
        (tmp_path / path).mkdir(parents=True)
    seeds = [batch / f"b__seed{seed}" for seed in (1, 2, 10)]
    # in seed order, each seed once though given twice; a directory not of the run's name is no seed of it
    assert plot.group_runs([batch, seeds[1], plain], plot.DEFAULT_GROUP) == {"b": seeds, "plain": [plain]}
    monkeypatch.chdir(batch)
    assert plot.group_runs([Path(".")], plot.DEFAULT_GROUP) == {"b": [seed.relative_to(batch) for seed in seeds]}


@pytest.mark.parametrize("name,group", [("cheetah__seed3", "cheetah"),
                                        ("HalfCheetah-v5__ppo__2__1763900000", "HalfCheetah-v5__ppo"),
                                        ("my_run", "my_run")])
def test_default_grouping_drops_the_seed(tmp_path, name, group):
    (tmp_path / name).mkdir()
    assert plot.group_runs([tmp_path / name], plot.DEFAULT_GROUP) == {group: [tmp_path / name]}


def test_interval_is_students_t():
    mean, half_width = plot.mean_and_interval(np.array([[1.0, 0.0], [3.0, 0.0]]))
    assert mean.tolist() == [2.0, 0.0]
    assert half_width == pytest.approx([12.706 * np.sqrt(2) / np.sqrt(2), 0.0])
    five = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    assert plot.mean_and_interval(five)[1] == pytest.approx([2.776 * np.std(five, ddof=1) / np.sqrt(5)])
