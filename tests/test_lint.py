"""The project's lint (ruff.toml): pyflakes, pycodestyle, and lines at most 120 columns, in every Python file."""

import subprocess
import sys

from tests.util import REPO


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
