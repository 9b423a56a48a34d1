"""scripts/check_copies.py: every `# Copied from` definition of the trainers equals its source; a one-character drift
in any marked copy, or a change of the source, is caught by name and rewritten from the source by --fix."""

import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.util import REPO

SCRIPT = REPO / "scripts/check_copies.py"
SIBLINGS = ("ppo_rnn.py", "ppo_rgb.py", "ippo.py")


def check(root, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *flags], capture_output=True, text=True,
                          timeout=120)


def checkout(tmp_path):
    for file in ("ppo.py", *SIBLINGS):
        shutil.copy(REPO / file, tmp_path / file)
    return tmp_path


def test_the_trainers_copies_equal_their_source():
    result = check(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    for sibling in SIBLINGS:  # each sibling holds copies of ppo.py, all checked
        counts = next(line for line in result.stdout.splitlines() if line.startswith(f"{sibling}: "))
        assert int(counts.split()[1]) >= 30 and counts.endswith(" 0 differing"), counts


@pytest.mark.parametrize("sibling", SIBLINGS)
def test_a_one_character_drift_in_a_copy_is_named_and_fixed(tmp_path, sibling):
    root = checkout(tmp_path)
    original = (root / sibling).read_text()
    marker = "# Copied from ppo.py\ndef compute_advantages("
    if marker not in original:
        marker = "# Copied from ppo.py\ndef bootstrap_mask("
    at = original.index(marker) + len(marker)
    line = original.count("\n", 0, original.index(marker)) + 2
    body = original.index("torch.", at)  # a character inside the definition's body
    (root / sibling).write_text(original[:body] + "T" + original[body + 1:])
    result = check(root)
    assert result.returncode == 1
    name = marker.split("def ")[1].rstrip("(")
    assert f"{sibling}:{line} {name} differs from its source" in result.stdout
    assert "--fix" in result.stdout
    fixed = check(root, "--fix")
    assert fixed.returncode == 0 and (root / sibling).read_text() == original
    assert check(root).returncode == 0


def test_a_change_of_the_source_reaches_every_copy_with_fix(tmp_path):
    root = checkout(tmp_path)
    source = (root / "ppo.py").read_text()
    old = 'def bootstrap_mask(rule: str, terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:\n'
    assert old in source
    (root / "ppo.py").write_text(source.replace(old, old + "    # a new comment line\n"))
    result = check(root)
    assert result.returncode == 1
    copied = [s for s in SIBLINGS if "# Copied from ppo.py\ndef bootstrap_mask(" in (REPO / s).read_text()]
    assert copied and all(f"{s}:" in result.stdout for s in copied)
    assert check(root, "--fix").returncode == 0 and check(root).returncode == 0
    for sibling in copied:
        assert "    # a new comment line\n" in (root / sibling).read_text()


def test_renamed_copies_and_replacements(tmp_path):
    (tmp_path / "ppo.py").write_text(textwrap.dedent('''\
        def scale(x):
            return 2 * x  # ppo


        @staticmethod
        def shift(x):
            return x + 1
        '''))
    copy = textwrap.dedent('''\
        # Copied from ppo.py: scale
        def double(x):
            return 2 * x  # ppo


        # Copied from ppo.py with x->y, + 1->+ 2
        @staticmethod
        def shift(y):
            return y + 2


        def own(x):
            return x
        ''')
    (tmp_path / "ippo.py").write_text(copy)
    result = check(tmp_path)
    assert result.returncode == 0 and "ippo.py: 2 marked copies, 0 differing" in result.stdout
    (tmp_path / "ippo.py").write_text(copy.replace("return y + 2", "return y + 3").replace("2 * x", "3 * x"))
    assert "2 differing" in check(tmp_path).stdout
    assert check(tmp_path, "--fix").returncode == 0 and (tmp_path / "ippo.py").read_text() == copy
    (tmp_path / "ippo.py").write_text(copy.replace("# Copied from ppo.py: scale", "# Copied from ppo.py: nothing"))
    refused = check(tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ippo.py:2 double: ppo.py has no top-level")
    # a mark that stands above no definition would leave its copy unchecked
    marked = "# Copied from ppo.py: scale\n"
    (tmp_path / "ippo.py").write_text(copy.replace(marked, marked + "# a comment between the mark and its copy\n"))
    stray = check(tmp_path)
    assert stray.returncode == 2 and stray.stderr.startswith("error: ippo.py:1: a 'Copied from' line must stand")
