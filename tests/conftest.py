"""The suite's processes use one torch thread each unless OMP_NUM_THREADS says otherwise: the suite runs two things
at once on its 2 cores (pytest-xdist's two workers; runs two at a time), and two runs of torch's two threads each
(ppo_rgb.py's default, --torch_threads 0) wait on each other's cores, a test of them 6 times as long
(benchmarks/results/suite_time/table.md). Set before torch is imported, here and so in every process the tests start,
which inherit the environment."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def verify_cache(tmp_path_factory):
    """scripts/verify_copy.py --cache for the session: the stock trainer's rounding of the seeds check, found once
    for the copies checked with the same flags (the recipes' and the tests' copies of ppo.py), shared by pytest-xdist's
    workers (their temporary directories' parent)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "verify_copy_cache"
