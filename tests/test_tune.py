"""scripts/tune.py: an Optuna search whose trials train many seeds in one process, scored by their IQM. Most tests
tune tests/tune_trainer.py, a stand-in that takes the trainers' flags and logs eval/return = -(x - 3)^2 + seed/100 at
steps 1 to --steps; one tunes ppo.py on CartPole."""

import os
import datetime
import hashlib
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from tests.util import REPO, run_script

optuna = pytest.importorskip("optuna")
sys.path.insert(0, str(REPO / "scripts"))
import tune  # noqa: E402

# its PostgreSQL server starts once: its tests run in one worker under pytest-xdist's --dist loadgroup
pytestmark = pytest.mark.xdist_group("test_tune")

STAND_IN = str(REPO / "tests/tune_trainer.py")
BEST_COMMAND = "The best trial's command (from the directory tune.py ran in):\n\n    "


def study_of(directory):
    return optuna.load_study(study_name="tune", storage=f"sqlite:///{directory / 'study.db'}")


def states(study) -> list[str]:
    return [trial.state.name for trial in study.trials]


@pytest.fixture
def fast_polls(monkeypatch, tmp_path):
    monkeypatch.setattr(tune, "POLL_SECONDS", 0.1)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("trainer, env_id, small", [
    ("ppo.py", "CartPole-v1", []), ("ppo_rnn.py", "CartPole-v1", ["--rnn_hidden_size", "16"]),
    ("ppo_rgb.py", "tests.envs:PixelSide-v0", ["--hidden_sizes", "64"]),
    ("ippo.py", "vmas:tests.vmas_scenarios:Clock", ["--hidden_sizes", "64", "--max_episode_steps", "16"])])
def test_a_tiny_search(tmp_path, fast_polls, capsys, trainer, env_id, small):
    """Each trial's seeds train in one process (--num_seeds), ppo_rnn.py's, ppo_rgb.py's and ippo.py's too."""
    argv = ["--trainer", str(REPO / trainer), "--env_id", env_id, "--trials", "2", "--seeds", "2", "--dir",
            "tuned", "--space", "learning_rate=1e-4:1e-2:log", "num_minibatches=1,2", "--", "--num_envs", "2",
            "--num_steps", "32", "--total_timesteps", "128", "--eval_freq", "2", "--num_eval_envs", "2", *small]
    assert tune.main(argv) == 0
    out = capsys.readouterr().out
    assert "| trial | learning_rate | num_minibatches | IQM | seeds | wall time (min) |" in out
    assert out == (tmp_path / "tuned/results.md").read_text()
    assert states(study_of(tmp_path / "tuned")) == ["COMPLETE", "COMPLETE"]  # two jobs, and no third trial
    for trial in study_of(tmp_path / "tuned").trials:  # each trial's seeds, in the tuning's directory
        assert {p.name for p in (tmp_path / f"tuned/runs/trial_{trial.number}").glob("trial_*__seed*")} == {
            f"trial_{trial.number}__seed1", f"trial_{trial.number}__seed2"}
    assert (tmp_path / "tuned/history.png").stat().st_size > 0
    best = out.split(BEST_COMMAND)[1].splitlines()[0]
    assert best.startswith(f"python {REPO / trainer} ") and "--num_seeds=2" in best and "--learning_rate=" in best


def test_a_trial_worse_than_the_median_is_pruned_and_stopped(tmp_path, fast_polls):
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "6", "--seeds", "2", "--jobs", "1",
            "--prune_after", "1", "--dir", "tuned", "--space", "x=0.0:6.0", "--", "--steps", "8",
            "--step_seconds", "0.3"]
    assert tune.main(argv) == 0
    study = study_of(tmp_path / "tuned")
    pruned = [trial for trial in study.trials if trial.state.name == "PRUNED"]
    assert pruned and len([t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]) == 6
    for trial in pruned:  # stopped by SIGTERM after a third of a completed trial's steps, before its last
        reported = sorted(trial.intermediate_values)
        assert reported and reported[-1] < 8 and 8 // 3 < trial.user_attrs["pruned_at"] < 8, trial.user_attrs
    assert f"Pruning: the {len(pruned)} pruned trials ran " in (tmp_path / "tuned/results.md").read_text()


def test_a_killed_tuning_continues_with_no_trial_counted_twice(tmp_path):
    argv = [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials",
            "3", "--seeds", "2", "--jobs", "1", "--prune_after", "0", "--dir", "tuned", "--heartbeat", "2", "--grace",
            "4", "--space", "x=0.0:6.0", "--", "--steps", "6", "--step_seconds", "0.5"]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "tuned/runs/trial_1").exists():  # trial 0 done, trial 1 running
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    cut = study_of(tmp_path / "tuned").trials[1]
    assert cut.state.name == "RUNNING"
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = study_of(tmp_path / "tuned").trials
    assert trials[1].state.name == "FAIL" and [t.state.name for t in trials].count("COMPLETE") == 3
    rerun = [t for t in trials if t.user_attrs.get("rerun_of") == 1]
    assert len(rerun) == 1 and rerun[0].params == cut.params and rerun[0].state.name == "COMPLETE"



@pytest.fixture(scope="module")
def postgresql_server(tmp_path_factory):
    """A PostgreSQL server of the tests' own (pgserver's wheel ships its binaries; as root it runs them as a user of
    its own, pgserver, which it adds, and opens the directories above its data and binaries to others' reading and
    traversal), started here and stopped after the module's tests."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("postgresql") / "data", cleanup_mode="stop")
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def postgresql(postgresql_server):
    """The tests' PostgreSQL server's URL."""
    return postgresql_server.get_uri()


def restart(server, down_seconds: float):
    """Stop the server at once (pg_ctl -m immediate: connections cut, as a crash would), and start it again later."""
    from pgserver._commands import pg_ctl

    pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=30)
    time.sleep(down_seconds)
    if server.system_user is not None:  # its user traverses to its data again: a pytest started since closes
        from pgserver.utils import ensure_prefix_permissions  # /tmp/pytest-of-USER to others
        ensure_prefix_permissions(server.pgdata)
    sockets = urllib.parse.parse_qs(urllib.parse.urlparse(server.get_uri()).query)["host"][0]
    pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {sockets}", "-l", str(server.log), "start"], pgdata=server.pgdata,
           user=server.system_user, timeout=60)


def as_host(hostname: str, argv: list[str]) -> list[str]:
    """argv run as on a machine of another name: in a UTS namespace of its own (unshare, as root or, where the
    kernel lets a user, in a user namespace)."""
    for unshare in (["unshare", "--uts"], ["unshare", "--user", "--map-root-user", "--uts"]):
        if shutil.which("unshare") and subprocess.run([*unshare, "hostname", hostname]).returncode == 0:
            return [*unshare, "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
    pytest.skip("no UTS namespace (unshare --uts) for a second hostname")


def tune_on(host: str, study: str, url: str, trials: int, step_seconds: float, grace: int = 4, steps: int = 6
            ) -> list[str]:
    return as_host(host, [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0",
                          "--trials", str(trials), "--seeds", "2", "--jobs", "1", "--prune_after", "0", "--heartbeat",
                          "2", "--grace", str(grace), "--storage", url, "--study_name", study, "--dir", host,
                          "--space", "x=0.0:6.0", "--", "--steps", str(steps), "--step_seconds", str(step_seconds)])


def running_on(url: str, study_name: str) -> set:
    """The hosts of the study's running trials."""
    if study_name not in optuna.get_all_study_names(url):  # not yet created
        return set()
    study = optuna.load_study(study_name=study_name, storage=url)
    return {t.user_attrs.get("host") for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))}


def test_a_database_restart_shorter_than_the_grace_is_ridden_out(tmp_path, postgresql_server):
    """The study's server cut for 6 s while two tune.py's trials train (each trial 3 s): each says so in a line and
    trains on, and tells its trials once the server answers; every trial completes once, none fails."""
    url = postgresql_server.get_uri()
    workers = [subprocess.Popen(tune_on(host, "restarted", url, 4, 0.5, grace=60), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for host in ("host-a", "host-b")]
    deadline = time.monotonic() + 120
    while running_on(url, "restarted") != {"host-a", "host-b"}:
        assert all(worker.poll() is None for worker in workers) and time.monotonic() < deadline
        time.sleep(0.2)
    restart(postgresql_server, 6)
    outputs = [worker.communicate(timeout=300) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    for _, err in outputs:
        gone = [line for line in err.splitlines() if "the study's database does not answer" in line]
        assert len(gone) == 1 and "(psycopg.OperationalError: " in gone[0] and "--grace" in gone[0], err[-2000:]
        assert "the study's database answers again, after " in err
    trials = optuna.load_study(study_name="restarted", storage=url).trials
    assert [t.state.name for t in trials if not t.user_attrs.get("surplus")] == ["COMPLETE"] * 4


def test_only_a_database_away_is_waited_for():
    """A connection refused or cut, a server shutting down or starting, SQLite locked by another writer: waited for,
    named by the driver's message; a disk full, a read-only SQLite file: an error at once, not an outage."""
    import sqlite3

    import psycopg
    import sqlalchemy

    def wrapped(error):
        return sqlalchemy.exc.OperationalError("INSERT", {}, error)
    assert tune.database_away(wrapped(psycopg.OperationalError("connection failed"))) == (
        "psycopg.OperationalError: connection failed")
    assert tune.database_away(wrapped(psycopg.errors.lookup("57P03")("the database system is starting up")))
    assert tune.database_away(wrapped(sqlite3.OperationalError("database is locked")))
    assert tune.database_away(wrapped(psycopg.errors.lookup("53100")("No space left on device"))) is None
    assert tune.database_away(wrapped(sqlite3.OperationalError("attempt to write a readonly database"))) is None


def test_a_write_that_landed_as_the_database_went_is_its_own_not_another_tunes(tmp_path):
    """A trial failed or told whose write reached the database just before the connection dropped: made again, the
    write finds the trial finished, which is this call's own doing (no other tune.py fails a trial within the grace),
    not another's; without a drop first, the same error is another's and raised."""
    import psycopg
    import sqlalchemy
    from optuna.exceptions import UpdateFinishedTrialError

    options = types.SimpleNamespace(dir=tmp_path, trainer=Path(STAND_IN), grace=60, heartbeat=1)
    tuning = tune.Tuning(options, {}, [])

    def landed(errors):
        def call():
            raise next(errors)
        return call
    dropped = sqlalchemy.exc.OperationalError("COMMIT", {}, psycopg.OperationalError("server closed the connection"))
    assert tuning.reach(landed(iter([dropped, UpdateFinishedTrialError("finished")]))) is True
    with pytest.raises(UpdateFinishedTrialError):
        tuning.reach(landed(iter([UpdateFinishedTrialError("finished")])))


def test_a_write_cut_inside_another_call_is_made_again_whole(tmp_path, postgresql_server):
    """The server cut as Optuna writes a trial's attribute in a call made inside another, on its session: the outer
    call is made again, on a session of its own (made again alone, the inner one would meet its session rolled
    back), and the attribute is stored once the server answers."""
    import sqlalchemy

    options = types.SimpleNamespace(dir=tmp_path, trainer=Path(STAND_IN), storage=postgresql_server.get_uri(),
                                    grace=60, heartbeat=1)
    tuning = tune.Tuning(options, {}, [])
    storage = tune.open_storage(optuna, tuning)
    trial_id = optuna.create_study(storage=storage, study_name="cut_inside").ask()._trial_id
    cuts = []

    def cut(connection, cursor, statement, *_):
        if "trial_user_attributes" in statement and statement.lstrip().startswith(("INSERT", "UPDATE")) and not cuts:
            cuts.append(statement)
            restart(postgresql_server, 0.5)

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", cut)
    storage.set_trial_user_attr(trial_id, "host", "host-a")
    assert len(cuts) == 1 and storage.get_trial(trial_id).user_attrs == {"host": "host-a"}


def test_a_database_away_past_the_grace_stops_in_one_line_and_a_finished_trial_is_kept(tmp_path, postgresql_server):
    """The server down for longer than --grace: tune.py stops in one line naming the driver's message, its trainer
    stopped; the trial that ended while the server was away is recorded from its files by the same command later, not
    run again."""
    url = postgresql_server.get_uri()
    argv = tune_on("host-a", "away", url, 2, 0.5, grace=6, steps=10)  # 5 s trials
    worker = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    # its end 3 s away: after the server has stopped (pg_ctl, as its user), before tune.py gives up (6 s after that)
    while len(tune.progress(tmp_path / "host-a/runs/trial_0", "eval/return")) < 4:
        assert worker.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    restart(postgresql_server, 12)  # tune.py notices at its next report, and waits 6 s more
    _, err = worker.communicate(timeout=300)
    errors = [line for line in err.splitlines() if line.startswith("error") or "Traceback" in line]
    assert worker.returncode == 2 and len(errors) == 1 and "no heartbeat recorded" not in err, err[-2000:]
    assert errors[0].startswith("error: the study's database did not answer for 6 s (--grace): psycopg.Operational")
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trial 0 ended while the study's database was away: its result recorded from " in again.stderr
    trials = optuna.load_study(study_name="away", storage=url).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and "rerun_of" not in trials[1].user_attrs


def test_two_machines_share_one_study_on_postgresql(tmp_path, postgresql):
    """--storage: two tune.py on machines of other names, each with its own directory, meet the trials asked for
    together, no trial counted twice (any asked for past --trials at once is failed as surplus), draw apart though
    they start together, and rank the same best."""
    workers = [subprocess.Popen(tune_on(host, "shared", postgresql, 5, 0.2), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for host in ("host-a", "host-b")]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    trials = optuna.load_study(study_name="shared", storage=postgresql).trials
    assert all(trial.user_attrs.get("surplus") for trial in trials if trial.state.name != "COMPLETE")
    trials = [trial for trial in trials if trial.state.name == "COMPLETE"]
    assert len(trials) == 5 and len({trial.params["x"] for trial in trials}) == 5
    for trial in trials:  # each trial ran once, on the machine that says so, in that machine's directory
        ran_in = [host for host in ("host-a", "host-b") if (tmp_path / host / f"runs/trial_{trial.number}").is_dir()]
        assert ran_in == [trial.user_attrs["host"]]
    assert {trial.user_attrs["host"] for trial in trials} == {"host-a", "host-b"}
    best = [out.split(BEST_COMMAND)[1].splitlines()[0] for out, _ in outputs]
    assert best[0].replace("host-a", "host-b") == best[1]


def test_no_output_shows_the_storages_password(tmp_path, fast_polls, postgresql, monkeypatch, capsys):
    """A password holding @ : / # ? %: quoted, the tuning runs and nothing it prints or writes shows it; as it is, or
    in a URL that does not parse or reach a server, one line without it; moved to PGPASSWORD, the same study."""
    password = "p@ss:w/rd#1?%z"
    quoted = urllib.parse.quote(password, safe="")
    sockets = postgresql.partition("?")[2]  # the server's socket directory, host=...
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--jobs", "1",
            "--prune_after", "0", "--dir", "tuned", "--study_name", "secret", "--space", "x=0:6"]
    assert tune.main([*argv, "--storage", f"postgresql+psycopg://postgres:{quoted}@/postgres?{sockets}"]) == 0
    printed = "".join(capsys.readouterr())
    written = "".join(path.read_bytes().decode(errors="replace") for path in (tmp_path / "tuned").rglob("*")
                      if path.is_file())  # the study's name in "study", the logs, results.md, the event files
    for text in (printed, written):
        assert password not in text
        assert quoted not in text
    for given in (f"postgresql+psycopg://postgres:{password}@/postgres?{sockets}",  # as it is: a driver would cut it
                  f"postgresql+psycopg://postgres:{quoted}@localhost:54x41/postgres",  # a port typo
                  f"postgresql+psycopg://postgres:{quoted}@localhost:5432postgres",  # the slash missing
                  f"postgresql+psycopg://postgres:{quoted}@127.0.0.1:9/postgres"):  # no server there
        assert tune.main([*argv, "--dir", "elsewhere", "--storage", given]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --storage postgresql+psycopg://postgres:***@") and err.count("\n") == 1, err
        for fragment in ("p@ss", "ss:w", "w/rd", "rd#1", "?%z", quoted):
            assert fragment not in err, err
    # in the query, as libpq and SQLAlchemy take it too
    assert tune.main([*argv, "--dir", "elsewhere", "--storage",
                      f"postgresql+psycopg://postgres@localhost:54x41/postgres?password={quoted}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --storage ") and err.count("\n") == 1 and "p@ss" not in err and quoted not in err
    assert tune.main([*argv, "--dir", "in_query", "--study_name", "secret_in_query", "--storage",
                      f"postgresql+psycopg://postgres@/postgres?{sockets}&password={quoted}"]) == 0
    marker = (tmp_path / "in_query/study").read_text()
    assert marker == f"secret_in_query in postgresql+psycopg://postgres@/postgres?{sockets}\n"
    monkeypatch.setenv("PGPASSWORD", password)
    assert tune.main([*argv, "--trials", "2", "--storage", f"postgresql+psycopg://postgres@/postgres?{sockets}"]) == 0
    assert len(optuna.load_study(study_name="secret", storage=postgresql).trials) == 2


def test_a_tuning_killed_on_one_machine_is_finished_by_another(tmp_path, postgresql):
    """A live trial on another machine is left alone however long it runs; one whose tune.py was killed sends no
    heartbeat, is failed by the other machine's tune.py and run again there, and no more trials are counted. The
    machines' database connections are in other time zones (PGTZ), 14 hours apart."""
    a = subprocess.Popen(tune_on("host-a", "killed", postgresql, 3, 1.5), cwd=tmp_path, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "PGTZ": "Asia/Tokyo"})
    b = subprocess.Popen(tune_on("host-b", "killed", postgresql, 3, 1.5), cwd=tmp_path, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PGTZ": "America/New_York"})
    deadline = time.monotonic() + 120
    while running_on(postgresql, "killed") != {"host-a", "host-b"}:
        assert a.poll() is None and b.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(5)  # past the heartbeat's grace of 4 seconds, both alive
    trials = optuna.load_study(study_name="killed", storage=postgresql).trials
    assert "FAIL" not in [trial.state.name for trial in trials]
    cut = next(t for t in trials if t.state.name == "RUNNING" and t.user_attrs.get("host") == "host-a")
    a.send_signal(signal.SIGKILL)
    a.wait()
    _, err = b.communicate(timeout=300)
    assert b.returncode == 0, err[-2000:]
    trials = optuna.load_study(study_name="killed", storage=postgresql).trials
    assert [t.number for t in trials if t.state.name == "FAIL"] == [cut.number]
    assert [t.state.name for t in trials].count("COMPLETE") == 3
    rerun, = [t for t in trials if t.user_attrs.get("rerun_of") == cut.number]
    assert rerun.params == cut.params and rerun.state.name == "COMPLETE" and rerun.user_attrs["host"] == "host-b"


def test_a_trial_whose_heartbeats_stop_is_failed_and_run_again_and_its_late_result_dropped(tmp_path, fast_polls,
                                                                                           monkeypatch, capsys):
    """Trial 0's heartbeats stop after its first (a stalled machine): the other job's wait fails it past the grace,
    stops its trainer and runs its settings again; the late run's end is a warning, not an error."""
    record_heartbeat, beats = optuna.storages.RDBStorage.record_heartbeat, {}

    def late_for_the_first(storage, trial_id):
        beats[trial_id] = beats.get(trial_id, 0) + 1
        if trial_id != min(beats) or beats[trial_id] == 1:
            record_heartbeat(storage, trial_id)
    monkeypatch.setattr(optuna.storages.RDBStorage, "record_heartbeat", late_for_the_first)
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--jobs", "2",
            "--heartbeat", "1", "--grace", "2", "--prune_after", "0", "--dir", "tuned", "--space", "x=0.0:6.0", "--",
            "--steps", "20", "--step_seconds", "0.3"]
    assert tune.main(argv) == 0
    trials = study_of(tmp_path / "tuned").trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[1].user_attrs["rerun_of"] == 0
    assert trials[1].params == trials[0].params
    assert "warning: trial 0 was failed by another tune.py as it ran" in capsys.readouterr().err
    late_run = tmp_path / "tuned/runs/trial_0"  # stopped before it logged anything, under load: no directory yet
    steps = tune.read_scalars(late_run, "eval/return")[0] if late_run.is_dir() else []
    assert len(steps) < 20  # its trainer was stopped


def test_trials_asked_for_without_a_heartbeat_are_failed_and_a_drawn_one_runs_again(tmp_path):
    """Two trials of tune.py processes that died between asking for a trial and its first heartbeat: a rerun taken
    from the queue (its settings fixed) and a fresh one (none drawn yet). A tune.py started later fails both once it
    has seen them so for --grace, runs the rerun's settings again, and finishes."""
    (tmp_path / "tuned").mkdir()
    study = optuna.create_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'tuned/study.db'}",
                                direction="maximize")
    study.enqueue_trial({"x": 1.5})
    study.ask(), study.ask()
    argv = [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials",
            "1", "--seeds", "1", "--jobs", "1", "--heartbeat", "1", "--grace", "2", "--dir", "tuned", "--space",
            "x=0.0:6.0"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    warned = "asked for by a tune.py that recorded no heartbeat of it, failed"
    assert f"warning: trial 0, {warned}: its settings run again" in done.stderr, done.stderr[-2000:]
    assert f"warning: trial 1, {warned}\n" in done.stderr
    trials = study_of(tmp_path / "tuned").trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "COMPLETE"]
    assert trials[2].params == {"x": 1.5} and trials[2].user_attrs["rerun_of"] == 0


def test_a_directory_holds_one_studys_runs(tmp_path, fast_polls, capsys):
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--dir", "tuned",
            "--space", "x=0.0:6.0"]
    assert tune.main(argv) == 0
    capsys.readouterr()
    for other, named in ((["--study_name", "other"], "other in study.db"),
                         (["--storage", f"sqlite:///{tmp_path / 'elsewhere.db'}"], f"tune in sqlite:///{tmp_path}")):
        assert tune.main(argv + other) == 2
        assert (f"error: --dir tuned holds the runs of study tune in study.db, whose trial numbers {named}") in (
            capsys.readouterr().err)
    assert not (tmp_path / "elsewhere.db").exists()  # a refused command writes nothing
    shared = ["--storage", f"sqlite:///{tmp_path / 'shared.db'}", "--study_name", "s"]
    assert tune.main(argv[:-4] + ["--dir", "a", "--space", "x=0.0:6.0", *shared]) == 0
    assert tune.main(argv[:-4] + ["--dir", "b", "--space", "x=0.0:1.0", *shared]) == 2  # other settings
    assert not (tmp_path / "b").exists()


def test_a_tuning_of_other_settings_is_refused_and_the_running_one_goes_on(tmp_path, fast_polls, capsys):
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "2", "--seeds", "2", "--jobs", "1",
            "--prune_after", "0", "--dir", "tuned", "--space", "x=0.0:6.0", "--", "--steps", "6", "--step_seconds",
            "0.3"]
    first = subprocess.Popen([sys.executable, str(REPO / "scripts/tune.py"), *argv], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "tuned/runs").glob("trial_0/*__seed2/events*")):  # its first trial runs
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    other = argv[:argv.index("--space")] + ["--space", "x=0.0:1.0", *argv[argv.index("--"):]]
    assert tune.main(other) == 2
    err = capsys.readouterr().err
    refusal = "holds a tuning of other settings (space x=0.0:6.0 there, x=0.0:1.0 here)"
    assert err.startswith("error: ") and err.count("\n") == 1 and refusal in err, err
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    study = study_of(tmp_path / "tuned")
    assert states(study) == ["COMPLETE", "COMPLETE"] and all(0 <= t.params["x"] <= 6 for t in study.trials)


def test_commands_of_other_settings_starting_together_never_share_a_study(tmp_path, fast_polls, monkeypatch,
                                                                         capsys):
    """The interleaving that mixed two spaces in one study: one command reads the study's settings (none yet), the
    other starts, and runs a trial, before the first asks for its trial. The trial asked for first holds the study:
    the later command's trial fails, counted nowhere, and it stops in one line."""
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--jobs", "1",
            "--prune_after", "0", "--dir", "tuned", "--space", "x=0.0:6.0"]
    other = [sys.executable, str(REPO / "scripts/tune.py"), *argv[:-1], "x=0.0:1.0"]
    ask, interleaved = optuna.Study.ask, []

    def the_other_command_first(study, *args, **kwargs):
        if not interleaved:
            interleaved.append(subprocess.run(other, cwd=tmp_path, capture_output=True, text=True, timeout=300))
        return ask(study, *args, **kwargs)
    monkeypatch.setattr(optuna.Study, "ask", the_other_command_first)
    assert tune.main(argv) == 2
    assert interleaved[0].returncode == 0, interleaved[0].stderr[-2000:]
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error") or "Traceback" in line]
    assert len(lines) == 1 and "holds a tuning of other settings (space x=0.0:1.0 there, x=0.0:6.0 here)" in lines[0]
    trials = study_of(tmp_path / "tuned").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL"] and trials[1].user_attrs["other_settings"]
    assert 0 <= trials[0].params["x"] <= 1
    assert "1 trials completed, 0 pruned, 0 failed" in (tmp_path / "tuned/results.md").read_text()


def test_the_same_settings_in_another_order_join_the_study(tmp_path, fast_polls):
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--jobs", "1",
            "--prune_after", "0", "--dir", "tuned", "--space", "x=0.0:6.0", "capture_video=true,false", "--",
            "--steps", "3", "--no_capture_video", "--step_seconds=0"]
    assert tune.main(argv) == 0
    reordered = [*argv[:argv.index("--space")], "--trials", "2", "--space", "capture_video=true,false", "x=0.0:6.0",
                 "--", "--step_seconds", "0", "--capture_video", "--steps=3", "--no-capture-video"]
    assert tune.main(reordered) == 0
    assert states(study_of(tmp_path / "tuned")) == ["COMPLETE", "COMPLETE"]


def read_only(directory: Path, argv: list[str]) -> list[str]:
    """argv run with directory mounted read-only (in a mount namespace of its own, as root or, where the kernel
    lets a user, in a user namespace): root writes in a directory whatever its mode."""
    remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    for unshare in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        if shutil.which("unshare") and subprocess.run([*unshare, "sh", "-c", remount, str(directory), "true"],
                                                      capture_output=True).returncode == 0:
            return [*unshare, "sh", "-c", remount, str(directory), *argv]
    pytest.skip("no mount namespace (unshare --mount) for a read-only directory")


def test_an_unwritable_directory_is_one_line_and_nothing_is_written(tmp_path):
    """A read-only working directory (the default --dir is in it) or --dir: one line, before anything is written."""
    (tmp_path / "ro").mkdir()
    argv = [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials",
            "1", "--seeds", "1", "--jobs", "1", "--space", "x=0:6"]
    for cwd, extra, refusal in (
            (tmp_path / "ro", [], f"--dir tunes/Tune-v0__tune_trainer cannot be written ({tmp_path / 'ro'} is "
                                  "read-only): give --dir a directory you can write"),
            (tmp_path, ["--dir", "ro/tuned"], f"--dir ro/tuned cannot be written ({tmp_path / 'ro'} is read-only)")):
        refused = subprocess.run(read_only(tmp_path / "ro", argv + extra), cwd=cwd, capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and refusal in refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert not list((tmp_path / "ro").iterdir())
    done = subprocess.run(argv + ["--dir", "ro/tuned"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_two_confirmations_at_once_run_once(tmp_path):
    """A second --confirm waits for the first and reads its result: nothing of the first is set aside or rewritten."""
    argv = [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials",
            "2", "--seeds", "2", "--jobs", "1", "--dir", "tuned", "--confirm", "2", "--space", "x=0.0:6.0", "--",
            "--steps", "6", "--step_seconds", "0.3"]
    both = [subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [process.communicate(timeout=300) for process in both]
    assert [process.returncode for process in both] == [0, 0], [err[-2000:] for _, err in outputs]
    assert outputs[0][0] == outputs[1][0] == (tmp_path / "tuned/results.md").read_text()
    runs = tmp_path / "tuned/runs"
    assert not list(runs.glob("*_cut_*"))
    confirmed = sorted(p.relative_to(runs).parent.name for p in runs.glob("confirm2_*/*__seed*/events*"))
    assert len(confirmed) == 4 and len(set(confirmed)) == 4, confirmed  # 2 runs of 2 seeds, each written once
    assert all(len(log.read_text().strip()) == 0 or "error" not in log.read_text() for log in
               (tmp_path / "tuned/logs").glob("confirm2_*.log"))


def test_the_confirmations_seeds_start_past_every_reset_seed_of_the_trials():
    """Seed s of a trial resets its envs with s to s + num_envs + num_eval_envs - 1, with the most of each that a
    trial may take: searched, given after --, or the trainer's default."""
    options = types.SimpleNamespace(seed=1, seeds=4, flags=["--num_eval_envs", "3"])
    fields = {"num_envs": 512, "num_eval_envs": 8}
    tuning = types.SimpleNamespace(options=options, fields=fields,
                                   space=[tune.Dimension("num_envs", choices=(2, 8)), tune.Dimension("x", 0.0, 1.0)])
    assert tune.confirmation_seed(tuning) == 1 + 3 + 8 + 3  # seed 4's envs reset with seeds 4 to 14
    tuning.space = [tune.Dimension("num_envs", 4, 16)]
    assert tune.confirmation_seed(tuning) == 1 + 3 + 16 + 3
    tuning.space, tuning.fields, options.flags = [], {}, []  # a trainer without the flags: one reset seed, its seed
    assert tune.confirmation_seed(tuning) == 5


def test_a_trainer_left_behind_is_stopped_and_no_other_process(tmp_path):
    """A cut trial's trainer, found by its pid and its own command line; a pid since taken by another is spared."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    trainer = subprocess.Popen(sleeper + ["--exp_name=trial_7"])
    other = subprocess.Popen(sleeper + ["--exp_name=trial_70"])
    for child in (trainer, other):  # until it runs its own command line: on a loaded machine the exec comes late
        deadline = time.monotonic() + 30
        while b"--exp_name=" not in Path(f"/proc/{child.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        tune.stop_left_behind(types.SimpleNamespace(number=7, user_attrs={"child": trainer.pid}))
        tune.stop_left_behind(types.SimpleNamespace(number=7, user_attrs={"child": other.pid}))
        assert trainer.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        trainer.kill()
        other.kill()


def test_confirm_runs_the_best_and_the_defaults_on_seeds_no_trial_used(tmp_path, fast_polls, monkeypatch, capsys):
    """The flags after -- are every run's, a searched one among them the defaults' value; --confirm_flags are the
    confirmation's alone. The curves drawn are the two runs', the one set aside left out; without a run to draw, a
    warning and no picture."""
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "2", "--seeds", "2", "--dir", "tuned",
            "--confirm", "3", "--confirm_flags", "--steps 6", "--space", "x=0.0:6.0", "--", "--x", "5"]
    # a confirmation cut short before (one step logged) is not taken for one that completed
    cut = f"confirm3_defaults_{hashlib.sha1(b'--steps 6').hexdigest()[:8]}"
    (tmp_path / "tuned").mkdir()
    subprocess.run([sys.executable, STAND_IN, "--num_seeds", "3", "--seed", "3", "--steps", "1", "--exp_name", cut],
                   cwd=tmp_path / "tuned", check=True)
    drawn_run_dirs, plot_curves = [], tune.plot_curves

    def recording_plot_curves(run_dirs, *rest, **options):
        drawn_run_dirs.append(run_dirs)
        return plot_curves(run_dirs, *rest, **options)
    monkeypatch.setattr(tune, "plot_curves", recording_plot_curves)
    assert tune.main(list(argv)) == 0
    runs = tmp_path / "tuned/runs"
    tuned = {p.name.rpartition("__seed")[2] for p in runs.glob("trial_*/*__seed*")}
    confirmed = {p.name.rpartition("__seed")[2] for p in runs.glob("confirm*/*__seed*")}
    assert tuned == {"1", "2"} and confirmed == {"3", "4", "5"}
    study = study_of(tmp_path / "tuned")
    best = max(study.best_trials, key=lambda t: t.number)
    named = {p.name.rpartition("_")[0] for p in runs.glob("confirm*") if "_cut_" not in p.name}
    assert named == {f"confirm3_trial{best.number}", "confirm3_defaults"}
    assert drawn_run_dirs == [[runs / cut.replace("defaults", f"trial{best.number}"), runs / cut]]
    curves = tmp_path / "tuned/confirmation_eval_return.png"
    pixels = pytest.importorskip("matplotlib.image").imread(curves)[..., :3]
    assert np.mean(np.all(np.abs(pixels - 229 / 255) < 1e-3, axis=-1)) < 0.01  # no ggplot grey: Optuna's style stays
    defaults = runs / cut
    assert len(list(runs.glob(f"{cut}_cut_*/*__seed*"))) == 3  # the cut one kept aside
    steps, _, values = zip(*(tune.read_scalars(seed, "eval/return") for seed in tune.seed_runs(defaults)))
    assert [list(s) for s in steps] == [list(range(1, 7))] * 3  # --confirm_flags: 6 steps where trials took 4
    assert [v[-1] for v in values] == pytest.approx([-(5 - 3) ** 2 + seed / 100 for seed in (3, 4, 5)], abs=1e-5)
    for trial in study.trials:  # the trial's x, not the defaults'
        x = trial.params["x"]
        assert trial.user_attrs["finals"] == pytest.approx([-(x - 3) ** 2 + seed / 100 for seed in (1, 2)], abs=1e-5)
    results = (tmp_path / "tuned/results.md").read_text()
    assert "Confirmed on seeds 3-5 (no trial used them or their envs' reset seeds), with --steps 6" in results
    assert "P(best > defaults) = " in results and "| defaults | 5 | -3.96 [" in results  # the defaults' x
    command = results.split(BEST_COMMAND)[1].splitlines()[0].split()
    assert [given for given in command if given.startswith("--x")] == [f"--x={best.params['x']}"]
    written = sorted(path.stat().st_mtime_ns for path in runs.rglob("events*"))
    assert tune.main(list(argv)) == 0 and (tmp_path / "tuned/results.md").read_text() == results
    assert sorted(path.stat().st_mtime_ns for path in runs.rglob("events*")) == written  # read, not rerun
    shutil.rmtree(runs / cut)
    capsys.readouterr()
    assert tune.main(list(argv)) == 0 and (tmp_path / "tuned/results.md").read_text() == results
    assert f"warning: no confirmation curves: {runs / cut} is not a run directory" in capsys.readouterr().err
    assert not curves.exists()


@pytest.mark.parametrize("given, refusal", [
    (["--space", "y=0:1"], "--space 'y=0:1': the trainer has no flag --y"),
    (["--space", "x=1:0"], "--space 'x=1:0' does not parse: LOW must be below HIGH"),
    (["--space", "x=a:b"], "--space 'x=a:b' does not parse"),
    (["--space", "x=0:6", "--", "--nope", "1"], "--nope (after --): the trainer has no such flag"),
    (["--space", "x=0:6", "--", "--stpes", "2"], "no such flag (did you mean --steps?)"),
    (["--space", "x=0:6", "--", "--seed", "1"], "--seed (after --): tune.py sets --seed for each run"),
    (["--space", "x=0:6", "--", "--resume", "runs/a"], "--resume (after --): every trial trains from the start"),
    (["--space", "x=0:6", "--confirm_flags=--nope 1"], "--nope (--confirm_flags): the trainer has no such flag"),
    (["--space", "x=0:6", "--confirm_flags=--steps"], "--steps (--confirm_flags): --steps takes a value"),
    (["--space", "x=0:6", "--", "--steps", "--step_seconds", "0"], "--steps (after --): --steps takes a value"),
    (["--space", "x=2"], "is one value, not a range or choices: give it after --"),
    (["--space", "x=0:6", "x=1:2"], "--space 'x=1:2': --x is searched twice (--space 'x=0:6' too)"),
    (["--space", "x=1e-4:inf:log"], "--space 'x=1e-4:inf:log' does not parse: infinite or NaN"),
    (["--space", "x=nan:1"], "does not parse: infinite or NaN"),
    (["--space", "steps=1.5:3"], "--space 'steps=1.5:3' does not parse: --steps takes integers"),
    (["--space", "steps=2,3.5"], "does not parse: --steps takes integers"),
    (["--space", "capture_video=true"], "--space 'capture_video=true' is one value, not choices"),
    (["--space", "steps=4,4"], "--space 'steps=4,4' is one value, not choices"),
    (["--space", "x=0:6", "--metric", "eval/never"], "logged no eval/never"),
    (["--space", "x=0:6", "--", "--fail"], "failed (exit 2): error: told to fail"),
    (["--space", "x=0:6", "--storage", "mysql://tuner:secret@127.0.0.1:9/db"],
     "--storage mysql://tuner:***@127.0.0.1:9/db needs its database driver (No module named 'MySQLdb'): pip install "
     "mysqlclient"),
    (["--space", "x=0:6", "--storage", "postgresql+psycopg://tuner@127.0.0.1:9/db"],
     "--storage postgresql+psycopg://tuner@127.0.0.1:9/db: (psycopg.OperationalError) connection failed"),
    (["--space", "x=0:6", "--storage", "nosuchdb://x"], "--storage nosuchdb://x: Can't load plugin"),
])
def test_bad_input_is_one_line_and_the_study_stays_usable(tmp_path, fast_polls, capsys, given, refusal):
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "2", "--jobs", "1",
            "--dir", "tuned"]
    assert tune.main(argv + given) == 2
    err = capsys.readouterr().err  # beside the progress bar's lines
    lines = [line for line in err.splitlines() if line.startswith("error") or "Traceback" in line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and refusal in lines[0], err
    assert tune.main(argv + ["--space", "x=0:6"]) == 0  # the same directory, the input corrected
    assert [state for state in states(study_of(tmp_path / "tuned")) if state != "FAIL"] == ["COMPLETE"]


def test_other_values_of_a_setting_that_failed_trials_drew_are_one_line(tmp_path, fast_polls, capsys):
    """Optuna keeps one distribution per setting in a study, its failed trials' too: the corrected space, of other
    choices, is refused in one line naming the way out."""
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "1", "--jobs", "1",
            "--dir", "tuned"]
    assert tune.main([*argv, "--space", "steps=2,3", "--", "--fail"]) == 2
    capsys.readouterr()
    assert tune.main([*argv, "--space", "steps=4,5"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error") or "Traceback" in line]
    assert len(lines) == 1 and "holds failed trials that drew a setting of --space from other values" in lines[0]


@pytest.mark.parametrize("given, refusal", [(["--seeds", "0"], "--seeds must be at least 1"),
                                             (["--grace", "-5"], "--grace must be at least 20 (twice --heartbeat)"),
                                             (["--jobs", "two"], "argument --jobs: invalid int value: 'two'")])
def test_a_bad_value_of_tunes_own_flags_is_one_line(tmp_path, given, refusal):
    result = run_script("scripts/tune.py", ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--space", "x=0:6", *given],
                        tmp_path)
    assert (result.returncode, result.stderr) == (2, f"error: {refusal}\n")


def test_a_checkpoint_given_relative_to_where_tune_started_is_found(tmp_path, fast_polls):
    """The trials run inside the tuning's directory: --checkpoint's path after -- is taken from where tune.py runs."""
    trained = run_script("ppo.py", ["--env_id", "CartPole-v1", "--exp_name", "start", "--num_envs", "2", "--num_steps",
                                    "16", "--num_minibatches", "2", "--total_timesteps", "32", "--no_capture_video"],
                         tmp_path)
    assert trained.returncode == 0, trained.stderr
    argv = ["--trainer", str(REPO / "ppo.py"), "--env_id", "CartPole-v1", "--trials", "1", "--seeds", "1", "--jobs",
            "1", "--dir", "tuned", "--space", "learning_rate=1e-4:1e-3:log", "--", "--num_envs", "2", "--num_steps",
            "16", "--num_minibatches", "2", "--total_timesteps", "64", "--eval_freq", "2", "--num_eval_envs", "1",
            "--checkpoint", "runs/start/final_ckpt.pt"]
    assert tune.main(argv) == 0
    assert states(study_of(tmp_path / "tuned")) == ["COMPLETE"]


def test_a_file_as_the_tunings_directory_is_refused_in_one_line(tmp_path, fast_polls, capsys):
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1/results.md").write_text("a tuning's results\n")
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "1", "--seeds", "2", "--jobs", "1",
            "--space", "x=0:6", "--dir", "t1/results.md"]
    assert tune.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --dir t1/results.md is a file"), err
    assert (tmp_path / "t1/results.md").read_text() == "a tuning's results\n"


def test_without_optuna_it_says_what_to_install(tmp_path, fast_polls, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)
    assert tune.main(["--trainer", STAND_IN, "--env_id", "Tune-v0", "--space", "x=0:6"]) == 2
    assert capsys.readouterr().err.strip().endswith("pip install optuna")


def test_a_space_file_is_read_as_the_flags_are(tmp_path, fast_polls):
    (tmp_path / "space.toml").write_text('x = "0.5:6.0:log"\ncapture_video = "true,false"\n')
    argv = ["--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials", "2", "--seeds", "1", "--dir", "tuned",
            "--space_file", "space.toml"]
    assert tune.main(argv) == 0
    trials = study_of(tmp_path / "tuned").trials
    assert all(0.5 <= t.params["x"] <= 6.0 and isinstance(t.params["capture_video"], bool) for t in trials)
    (tmp_path / "space.toml").write_text("x = [0, 6\n")
    assert tune.main(argv[:-4] + ["--dir", "other", "--space_file", "space.toml"]) == 2


def test_a_stopped_tuning_stops_its_trainers_and_runs_their_trials_again(tmp_path):
    argv = [sys.executable, str(REPO / "scripts/tune.py"), "--trainer", STAND_IN, "--env_id", "Tune-v0", "--trials",
            "2", "--seeds", "2", "--jobs", "1", "--prune_after", "0", "--dir", "tuned", "--space", "x=0.0:6.0", "--",
            "--steps", "8", "--step_seconds", "0.3"]
    tuning = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "tuned/runs/trial_0").glob("*__seed2/events*")):  # training
        assert tuning.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    child = study_of(tmp_path / "tuned").trials[0].user_attrs["child"]
    tuning.send_signal(signal.SIGTERM)
    assert tuning.wait(timeout=60) == 130 and "the same command continues" in tuning.stderr.read()
    with pytest.raises(ProcessLookupError):  # its trainer stopped, and was waited for, with it
        os.kill(child, 0)
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = study_of(tmp_path / "tuned").trials
    assert trials[0].state.name == "FAIL" and [t.state.name for t in trials].count("COMPLETE") == 2
    assert [t.params for t in trials if t.user_attrs.get("rerun_of") == 0] == [trials[0].params]


def test_what_pruning_saved_is_the_pruned_trials_time_against_the_completed_trials_mean():
    start = datetime.datetime(2026, 1, 1)

    def trial(minutes: float):
        end = start + datetime.timedelta(minutes=minutes)
        return types.SimpleNamespace(datetime_start=start, datetime_complete=end)

    # completed 10 and 20 min (mean 15); pruned 3 min: 12 min saved of the 45 the three would have taken
    line, = tune.savings([trial(10), trial(20)], [trial(3)])
    assert "the 1 pruned trials ran 3.0 min" in line and "12.0 min saved, 27% of the 45.0 min" in line
    assert tune.savings([trial(10)], []) == []


def test_a_trials_values_replace_the_defaults_flags_with_their_values():
    flags = ["--hidden_sizes", "64", "64", "--log_std_init", "-0.5", "--no_norm_obs", "--x=1", "--gae-lambda", "0.9"]
    assert tune.without(flags, {"hidden_sizes", "norm_obs", "x"}) == ["--log_std_init", "-0.5", "--gae-lambda", "0.9"]
    kept = ["--hidden_sizes", "64", "64", "--no_norm_obs", "--x=1"]
    assert tune.without(flags, {"log_std_init", "gae_lambda"}) == kept
    assert tune.names(["--total_timesteps", "9", "--no_norm_obs"]) >= {"total_timesteps", "norm_obs"}
    given = [*flags, "--x", "2", "--norm_obs", "--hidden_sizes=32"]
    values = {name: tune.given_value(given, name, None) for name in ("hidden_sizes", "log_std_init", "norm_obs", "x")}
    assert values == {"hidden_sizes": "32", "log_std_init": "-0.5", "norm_obs": True, "x": "2"}  # the last counts
    assert tune.given_value(flags, "norm_obs", True) is False and tune.given_value(flags, "seed", 7) == 7
    fields = {"hidden_sizes": (64, 64), "log_std_init": -0.5, "norm_obs": False, "x": 0.0, "gae_lambda": 0.95,
              "seed": 1}
    tune.check_flags(flags, fields)  # the trainer's own, values such as -0.5 not taken for flags
    with pytest.raises(tune.UserError, match="--seed=2 .after --.: tune.py sets --seed"):
        tune.check_flags(["--seed=2"], fields)


def test_a_range_takes_the_flags_type_and_a_flag_of_several_values_is_refused():
    fields = {"ent_coef": 0.0, "update_epochs": 4, "target_kl": None, "hidden_sizes": (64, 64)}
    assert tune.parse_dimension("ent_coef=0:1", fields) == tune.Dimension("ent_coef", 0.0, 1.0)
    assert isinstance(tune.parse_dimension("ent_coef=0:1", fields).low, float)
    assert tune.parse_dimension("update_epochs=4:20", fields) == tune.Dimension("update_epochs", 4, 20)
    assert isinstance(tune.parse_dimension("target_kl=0.01:0.1", fields).low, float)
    with pytest.raises(tune.UserError, match="--hidden_sizes takes several values"):
        tune.parse_dimension("hidden_sizes=64,128", fields)
