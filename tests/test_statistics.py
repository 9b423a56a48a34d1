"""scripts/summarize.py's and scripts/plot.py's statistics across seeds and tasks (rliable's IQM, stratified
bootstrap intervals, aggregates, probability of improvement, performance profiles) on runs of known final values,
against numbers computed here by hand."""

import re
import sys

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from tests.util import REPO

sys.path.insert(0, str(REPO / "scripts"))
import plot  # noqa: E402
import summarize  # noqa: E402

# final eval/return of each run: group (algorithm) -> task -> one value per seed
FINALS = {"ppo": {"Hopper-v5": [1000, 2000, 3000, 2500], "Walker2d-v5": [1000, 1500, 4000, 3000]},
          "idea": {"Hopper-v5": [2000, 2500, 2800, 2900], "Walker2d-v5": [3000, 3500, 3600, 3900]}}
SCALE = {"Hopper-v5": 3000.0, "Walker2d-v5": 4000.0}
ACROSS_TASKS = ["--group", r"_(\w+?)__seed\d+$", "--tasks", "^(.*?)_", "--normalize", "Hopper-v5=0:3000",
                "Walker2d-v5=0:4000"]


@pytest.fixture
def runs(tmp_path):
    """runs/{task}_{group}__seed{s}, whose eval/return climbs to its final value in three steps."""
    for group, tasks in FINALS.items():
        for task, finals in tasks.items():
            for seed, final in enumerate(finals, 1):
                writer = SummaryWriter(str(tmp_path / "runs" / f"{task}_{group}__seed{seed}"))
                for step in (1, 2, 3):
                    writer.add_scalar("eval/return", final * step / 3, step * 100)
                writer.close()
    return tmp_path / "runs"


def interquartile_mean(values) -> float:
    """The mean of the middle half: a quarter of the sorted values cut at each end (none of fewer than 4)."""
    values = np.sort(np.ravel(values))
    cut = len(values) // 4
    return float(values[cut:len(values) - cut].mean())


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def interval(cell: str) -> tuple[float, float, float]:
    point, low, high = map(float, re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell).groups())
    return point, low, high


def test_iqm_of_each_group_and_its_interval(runs, capsys):
    assert summarize.main([str(p) for p in sorted(runs.glob("Hopper-v5_ppo__seed*"))] + ["--iqm"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    point, low, high = interval(cells(row)[2])
    assert point == pytest.approx(interquartile_mean([1000, 2000, 3000, 2500]))  # 2250: the middle two
    assert 1000 <= low <= point <= high <= 3000 and low < high
    out = runs.parent / "plots"
    assert plot.main([str(p) for p in sorted(runs.glob("Hopper-v5_*"))] + ["--iqm", "--out", str(out)]) == 0
    assert (out / "eval_return.png").stat().st_size > 10_000


def test_the_same_runs_give_the_same_intervals_each_time(runs, capsys):
    """The bootstrap is seeded: numpy's global random state, which rliable's stratified bootstrap draws from, neither
    changes a table nor is changed by one."""
    argv = [str(p) for p in sorted(runs.glob("Hopper-v5_ppo__seed*"))] + ["--iqm"]
    tables = []
    for seed in (1, 2):
        np.random.seed(seed)
        assert summarize.main(argv) == 0
        tables.append(capsys.readouterr().out)
        assert np.random.randint(2**31) == np.random.RandomState(seed).randint(2**31)
    assert tables[0] == tables[1]


def test_aggregates_across_tasks_against_hand_computed_ones(runs, capsys):
    argv = [str(p) for p in sorted(runs.iterdir())] + ACROSS_TASKS + ["--compare", "idea", "ppo"]
    assert summarize.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {cells(line)[0]: cells(line) for line in lines if line.startswith("| ") and "[" in line}
    for group, tasks in FINALS.items():
        normalized = np.array([np.array(finals) / SCALE[task] for task, finals in tasks.items()])  # tasks x runs
        expected = {"IQM": interquartile_mean(normalized), "mean": normalized.mean(),
                    "median": np.median(normalized.mean(axis=1)),  # of the tasks' means, as rliable's
                    "optimality gap": np.maximum(1 - normalized, 0).mean()}
        assert rows[group][1] == "4"
        for column, value in zip(cells(lines[2])[2:], rows[group][2:]):
            point, low, high = interval(value)
            assert point == pytest.approx(expected[column], abs=1e-3), column
            assert low <= point <= high, column
    # P(X > Y): the chance that a run of X beats a run of Y on a task (ties half), averaged over the tasks
    wins = [np.mean([(x > y) + 0.5 * (x == y) for x in FINALS["idea"][task] for y in FINALS["ppo"][task]])
            for task in SCALE]
    point, low, high = map(float, re.search(r"P\(idea > ppo\) = (\S+) \[(\S+), (\S+)\]", lines[-1]).groups())
    assert point == pytest.approx(np.mean(wins), abs=1e-3) and low <= point <= high
    out = runs.parent / "plots"
    assert plot.main([str(p) for p in sorted(runs.iterdir())] + ACROSS_TASKS + ["--out", str(out)]) == 0
    assert (out / "performance_profile_eval_return.png").stat().st_size > 10_000


@pytest.mark.parametrize("change,says", [
    (["--normalize", "Hopper=0:3000"], "--normalize names ['Hopper'], which no run is a task of"),
    (["--normalize", "Hopper-v5=1:1"], "--normalize takes TASK=LOW:HIGH with LOW != HIGH"),
    (["--compare", "idea", "sac"], "--compare: no group 'sac'"),
    (["--uneven"], "idea has a different number of runs on its tasks"),
    (["--no_rliable"], "need rliable"),
])
def test_bad_input_is_one_line(runs, capsys, monkeypatch, change, says):
    run_dirs = [str(p) for p in sorted(runs.iterdir())]
    if change == ["--uneven"]:
        run_dirs.remove(str(runs / "Hopper-v5_idea__seed4"))
        change = []
    if change == ["--no_rliable"]:
        monkeypatch.setitem(sys.modules, "rliable", None)  # as where it is not installed
        change = []
    assert summarize.main(run_dirs + ACROSS_TASKS + change) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
