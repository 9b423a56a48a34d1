import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parent.parent


def script_env() -> dict:
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"}


class Zygote:
    """tests/zygote.py, started on first use: the suite's runs of the project's scripts start as its forks, which
    have torch and the rest imported already (about 3.5 s of every run)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server = subprocess.Popen([sys.executable, "-m", "tests.zygote", str(theirs.fileno())], cwd=REPO,
                                       env=script_env(), stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
        theirs.close()
        self.socket, self.send_lock, self.tokens = ours, threading.Lock(), itertools.count()
        self.replies: dict[tuple[str, int], int] = {}
        self.replied, self.ended = threading.Condition(), False
        threading.Thread(target=self.read_replies, daemon=True).start()

    def read_replies(self):
        try:
            while message := self.socket.recv(4096):
                kind, token, value = pickle.loads(message)
                with self.replied:
                    self.replies[kind, token] = value
                    self.replied.notify_all()
        finally:  # the zygote died: nothing it started will be reported, so no test may wait for it
            with self.replied:
                self.ended = True
                self.replied.notify_all()

    def reply(self, kind: str, token: int, timeout: float | None) -> int | None:
        with self.replied:
            self.replied.wait_for(lambda: (kind, token) in self.replies or self.ended, timeout)
            if (kind, token) not in self.replies and self.ended:
                raise RuntimeError(f"tests/zygote.py ended (exit status {self.server.poll()}): see its stderr")
            return self.replies.get((kind, token))

    def start(self, argv: list[str], cwd: Path, env: dict, new_session: bool) -> "ForkedProcess":
        token = next(self.tokens)
        stdout, stderr = os.pipe(), os.pipe()
        with open(os.devnull) as stdin, self.send_lock:
            socket.send_fds(self.socket, [pickle.dumps(dict(token=token, argv=argv, cwd=str(cwd), env=env,
                                                            new_session=new_session))],
                            [stdin.fileno(), stdout[1], stderr[1]])
        os.close(stdout[1])
        os.close(stderr[1])
        return ForkedProcess(self, token, argv, stdout[0], stderr[0])


class ForkedProcess:
    """What the tests use of subprocess.Popen (text mode, stdout and stderr piped) for a Zygote's child."""

    def __init__(self, zygote: Zygote, token: int, argv: list[str], stdout: int, stderr: int):
        self.zygote, self.token, self.args = zygote, token, [sys.executable, *argv]
        self.pid = zygote.reply("started", token, 60)
        if self.pid is None:
            raise RuntimeError(f"tests/zygote.py did not start {argv}: {zygote.server.poll()=}")
        self.returncode: int | None = None
        self.output = {}
        self.readers = [threading.Thread(target=self.read, args=(name, fd), daemon=True) for name, fd in
                        (("stdout", stdout), ("stderr", stderr))]
        for reader in self.readers:
            reader.start()

    def read(self, name: str, fd: int):
        with open(fd, encoding="utf-8", errors="replace") as f:
            self.output[name] = f.read()

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.reply("ended", self.token, timeout)
            if self.returncode is None and timeout != 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        for reader in self.readers:  # the pipes close when the child and whatever it started have ended
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():  # a process the child started (e.g. a torchrun rank) still holds a pipe
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.output["stdout"], self.output["stderr"]

    def send_signal(self, signum: int):
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended before the zygote's report arrived
                os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)


ZYGOTE: list[Zygote] = []
ZYGOTE_LOCK = threading.Lock()


def start_python(argv: list[str], cwd: Path, env: dict | None = None, new_session: bool = False) -> ForkedProcess:
    """`python ARGV` (a script path or -m MODULE first) from cwd, as a fork of the suite's Zygote."""
    with ZYGOTE_LOCK:
        if not ZYGOTE:
            ZYGOTE.append(Zygote())
    return ZYGOTE[0].start(argv, cwd, env or script_env(), new_session)


def run_python(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 900
               ) -> subprocess.CompletedProcess:
    """subprocess.run of `python ARGV` with its output captured as text, as a fork of the suite's Zygote."""
    proc = start_python(argv, cwd, env)
    try:
        stdout, stderr = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # as subprocess.run does: what the child started may hold the pipes on
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_script(script: str, args: list[str], cwd: Path, timeout: float = 900, extra_env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """Run a project script as a user would, from cwd, with the repo on PYTHONPATH for tests.envs."""
    return run_python([str(REPO / script), *args], cwd, {**script_env(), **(extra_env or {})}, timeout)


def run_scripts(runs: list[tuple], cwd: Path, timeout: float = 900) -> list[subprocess.CompletedProcess]:
    """Independent runs, (script, args) from cwd or (script, args, their own cwd), as run_script runs each, two at a
    time: the trainers use one torch thread (ppo_rgb.py aside), so a second run takes the second core of the 2-core
    machines the suite is sized for. The results in the order of runs."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda run: run_script(run[0], run[1], run[2] if len(run) > 2 else cwd, timeout=timeout),
                             runs))


class Ahead:
    """The runs a module's tests read, started ahead by runs_ahead: ahead[name] waits for run name and is its
    directory and what its function returned (a run that raised raises here, in the test that reads it)."""

    def __init__(self, started: dict[str, tuple[Path, Future]]):
        self.started = started

    def __getitem__(self, name: str) -> tuple[Path, object]:
        directory, future = self.started[name]
        return directory, future.result()


def runs_ahead(jobs: dict[str, tuple[tuple[str, ...], Callable[[Path], object]]], workers: int = 2,
               from_the_first_test: bool = False):
    """A module-scoped fixture for independent runs that tests read (name: (the tests that read it, a function of a
    directory of its own that runs it)): the runs of the tests selected in the module start when the first of those
    tests starts, two at a time (one per core of the 2-core machines the suite is sized for) in the order of jobs
    (the longest first keeps both cores busy to the end), so that a test reading one run leaves the second core to
    another test's. Tests are named as pytest names them, parameters included (test_x[a]). workers: how many run at
    once (1 for runs of two processes each). from_the_first_test: start them when the module's first test starts,
    whether or not it reads one, so that they run beside the module's other tests."""
    import pytest  # here: scripts/verify_copy.py, a tool of the runtime set-up, imports this module's other helpers

    @pytest.fixture(scope="module", autouse=from_the_first_test)
    def ahead(request, tmp_path_factory):
        selected = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}
        pool = ThreadPoolExecutor(max_workers=workers)
        started = {}
        for name in (name for name, (tests, _) in jobs.items() if selected.intersection(tests)):
            directory = tmp_path_factory.mktemp(name)
            started[name] = (directory, pool.submit(jobs[name][1], directory))
        try:
            yield Ahead(started)
        finally:  # what has not started does not start; what runs ends within its own timeout
            pool.shutdown(cancel_futures=True)

    return ahead


def refused_in_one_line(module, argv: list[str], cwd: Path, capfd, whole_process: bool) -> str:
    """module.cli(argv) run from cwd exits with status 2 and one error line, which is returned. whole_process: in a
    process of its own as a user runs it (its exit status, no traceback on stderr); otherwise in the test's process,
    which saves the start of one (importing torch and the simulators, about 2 s)."""
    if whole_process:
        result = run_script(Path(module.__file__).name, argv, cwd, timeout=120)
        returncode, stderr = result.returncode, result.stderr
    else:
        with contextlib.chdir(cwd):
            returncode = module.cli(argv)
        stderr = capfd.readouterr().err  # fd 2 too: what C extensions and subprocesses write
    assert returncode == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def start_script(script: str, args: list[str], cwd: Path) -> ForkedProcess:
    """Start a project script in a new session, so that a test can signal its whole process group."""
    return start_python([str(REPO / script), *args], cwd, new_session=True)


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a run: tag -> [(step, value)] from every event file in the dir, purged steps left out."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def machine() -> str:
    """This machine as benchmark tables name it: its cores and its CPU's model name."""
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    return f"{os.cpu_count()} cores ({models[0] if models else 'CPU model unknown'})"


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def fast_args(env_id: str, exp_name: str, **overrides) -> list[str]:
    """A small, quick configuration: a few iterations, no video."""
    options = {"env_id": env_id, "exp_name": exp_name, "num_envs": 2, "num_steps": 16, "num_minibatches": 2,
               "update_epochs": 2, "total_timesteps": 32 * 4, "eval_freq": 2, "num_eval_envs": 1,
               "gamma": 0.99, "gae_lambda": 0.95, **overrides}
    argv = []
    for key, value in options.items():
        if value is None and key == "exp_name":  # the trainer's own run name
            continue
        if value is True:
            argv.append(f"--{key}")
        elif value is False:
            argv.append(f"--no_{key}")
        else:
            argv += [f"--{key}", str(value)]
    if "capture_video" not in options:
        argv.append("--no_capture_video")
    return argv


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file below directory with its size and modification time, the lock file left out."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".lock"}


def wait_for(path: Path, proc: subprocess.Popen, timeout: float):
    """Until path exists (e.g. the checkpoint after which a test signals the run), proc ends, or timeout passes."""
    deadline = time.time() + timeout
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)


def sigterm_beside_full_run(script: str, full_args: list[str], cut_args: list[str], checkpoint: Path,
                            cwd: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The uninterrupted run and the run to cut, side by side (most of a short run is its process starting): the
    second gets SIGTERM once checkpoint exists. Both finished: (full, cut), with their exit status and stderr."""
    full, cut = start_script(script, full_args, cwd), start_script(script, cut_args, cwd)
    try:
        wait_for(checkpoint, cut, 300)
        cut.send_signal(signal.SIGTERM)
        _, cut_stderr = cut.communicate(timeout=300)
        _, full_stderr = full.communicate(timeout=300)
    finally:  # a failure above leaves neither run going into the next test
        for launched in (full, cut):
            if launched.poll() is None:
                launched.kill()
                launched.communicate(timeout=60)
    return (subprocess.CompletedProcess(full.args, full.returncode, "", full_stderr),
            subprocess.CompletedProcess(cut.args, cut.returncode, "", cut_stderr))


TIMING_TAGS = {"charts/SPS", "time/rollout_time", "time/update_time", "time/rollout_fps"}


@contextlib.contextmanager
def running(script: str, args: list[str], cwd: Path, started: Path):
    """A run of script going on for the with block, from when it has written started; then stopped by SIGTERM, which
    it answers by saving a checkpoint and exiting with 128 + SIGTERM."""
    proc = start_script(script, args, cwd)
    try:
        wait_for(started, proc, 120)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM


def assert_refused_as_in_use(result: subprocess.CompletedProcess, holder_pid: int):
    """result: a start refused with one error line because process holder_pid writes the run directory."""
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"in use by another process (pid {holder_pid})" in errors[0], result.stderr


def assert_same_numbers(run_a: Path, run_b: Path, tags=frozenset({"losses/policy_loss", "eval/return"})):
    """Two runs logged the same scalars (timings aside) and ended with the same weights."""
    a, b = scalars(run_a), scalars(run_b)
    assert set(a) == set(b) and tags <= set(a)
    for tag in set(a) - TIMING_TAGS:
        assert a[tag] == b[tag], tag
    model_a, model_b = load(run_a / "final_ckpt.pt")["model"], load(run_b / "final_ckpt.pt")["model"]
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key


def spy_on_advantages(monkeypatch, trainer) -> list[dict[str, torch.Tensor]]:
    """Record the inputs of every call of trainer.compute_advantages (rewards, values, dones, bootstrap_values) and
    its output (advantages)."""
    captured = []
    compute_advantages = trainer.compute_advantages

    def spy(rewards, values, dones, bootstrap_values, *rest):
        advantages = compute_advantages(rewards, values, dones, bootstrap_values, *rest)
        captured.append(dict(rewards=rewards.clone(), values=values.clone(), dones=dones.clone(),
                             bootstrap_values=bootstrap_values.clone(), advantages=advantages.clone()))
        return advantages

    monkeypatch.setattr(trainer, "compute_advantages", spy)
    return captured


def video_frames(path: Path) -> tuple[int, tuple[int, int]]:
    """A video's number of frames and its (width, height)."""
    import imageio

    reader = imageio.get_reader(path)
    try:
        return reader.count_frames(), tuple(reader.get_meta_data()["size"])
    finally:
        reader.close()


class HostSyncs(torch.overrides.TorchFunctionMode):
    """The torch calls made inside it that would wait for a CUDA device if the tensors lived there: a value or a
    copy read on the host, or a result whose shape depends on values (boolean-mask indexing, nonzero). Counted on the
    CPU, where nothing waits, so that a rollout step's host synchronizations are tested without a GPU."""

    READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__repr__",
             "__format__", "nonzero", "masked_select", "unique", "argwhere"}

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        masked = name in ("__getitem__", "__setitem__", "index_put_") and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool
            for index in (args[1] if isinstance(args[1], tuple) else (args[1],)))
        # On the CPU a move to the learner's device (a torch.device, CUDA's in a GPU run) is no move; one to "cpu"
        # by name is, in any run. (A move to torch.device("cpu") cannot be told from the first here: CUDA's sync
        # debug mode catches it, benchmarks/torch_env_speed.py.)
        moved = name == "to" and any(isinstance(arg, str) and arg.startswith("cpu") for arg in (*args[1:],
                                                                                               *kwargs.values()))
        # torch.normal(mean, std) checks that std >= 0 with a read (CUDA's sync debug mode caught it, 2026-12-04)
        checked = name == "normal" and isinstance(kwargs.get("std", args[1] if len(args) > 1 else None), torch.Tensor)
        if name in self.READS or masked or moved or checked or (name == "where" and len(args) + len(kwargs) == 1):
            self.calls.append(name)
        return func(*args, **kwargs)
