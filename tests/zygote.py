"""Starts the suite's runs of the project's scripts as forks of one process that has already imported what every
trainer imports: torch and the rest take about 3.5 s of a short run's 4 s to import (tests/util.py's start_python).

`python -m tests.zygote FD` serves requests on the SOCK_SEQPACKET socket FD: each is a pickled dict (argv, as after
`python`: a script path or -m MODULE first; cwd; env; new_session) sent with three file descriptors, the child's
stdin, stdout and stderr. For each it forks a child, which runs the script as `python ARGV` would run it in a fresh
process with that environment (sys.path and sys.argv as Python sets them, its own session if asked), and answers
("started", token, pid), later ("ended", token, returncode) with returncode as subprocess gives it. It imports but
runs nothing of torch, so no OpenMP pool exists to be lost in the fork (numpy's OpenBLAS threads handle forks).
What a fork shares that fresh interpreters would not: the modules above (imported under the zygote's environment),
Python's hash seed, and the zygote's frames in a traceback.
"""

import os
import pickle
import runpy
import select
import signal
import socket
import sys

import gymnasium  # noqa: F401  (what every trainer imports: once here, not in every run)
import numpy  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (a process's first torch.optim optimizer imports it: 1.5 s)
import tqdm  # noqa: F401
import tyro  # noqa: F401
from torch.utils.tensorboard import SummaryWriter  # noqa: F401

# What Python puts on sys.path besides the script's directory and PYTHONPATH: the standard library, site-packages.
BASE_PATH = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]


def serve(sock: socket.socket) -> dict:
    """Fork a child per request until the socket closes; returns, in a child only, its request."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd interrupts select() when a child ends
    tokens = {}
    while True:
        readable, _, _ = select.select([sock, wakeup_read], [], [])
        if wakeup_read in readable:
            os.read(wakeup_read, 4096)
        while tokens:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            sock.send(pickle.dumps(("ended", tokens.pop(pid), os.waitstatus_to_exitcode(status))))
        if sock not in readable:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return {}
        request = pickle.loads(message)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(sock.detach())
            for fd in (wakeup_read, wakeup_write):
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return request
        for fd in fds:
            os.close(fd)
        tokens[pid] = request["token"]
        sock.send(pickle.dumps(("started", request["token"], pid)))


def run(request: dict):
    """What `python ARGV` does in request's directory and environment, in this process."""
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first, as python -m does
        sys.path[:] = [os.getcwd(), *pythonpath, *BASE_PATH]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *pythonpath, *BASE_PATH]
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    request = serve(socket.socket(fileno=int(sys.argv[1])))
    if request:
        run(request)  # its SystemExit or exception ends the child as it ends a fresh interpreter
