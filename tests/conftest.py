"""The suite's processes use one torch thread each unless OMP_NUM_THREADS says otherwise: the suite runs two things
at once on its 2 cores (pytest-xdist's two workers; runs two at a time), and two runs of torch's two threads each
(ppo_rgb.py's default, --torch_threads 0) wait on each other's cores, a test of them 6 times as long
(benchmarks/results/suite_time/table.md). Set before torch is imported, here and so in every process the tests start,
which inherit the environment."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
