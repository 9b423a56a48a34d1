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
    for file in ("ppo.py", *SIBLINGS, "ppo_eval.py", "scripts/intended_differences.txt"):
        (tmp_path / file).parent.mkdir(exist_ok=True)
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


        # Copied from ppo.py with x->y, 1->2
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
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ippo.py:2 double: ppo.py has no definition nothing")
    # a mark that stands above no definition would leave its copy unchecked
    marked = "# Copied from ppo.py: scale\n"
    (tmp_path / "ippo.py").write_text(copy.replace(marked, marked + "# a comment between the mark and its copy\n"))
    stray = check(tmp_path)
    assert stray.returncode == 2 and stray.stderr.startswith("error: ippo.py:1: a 'Copied from' line must stand")


SOURCE = '''\
import math

# Constants that copies share.
LOG_TWO = math.log(2)
HALF = 0.5


class Agent:
    def normalize(self, x):
        return x * HALF
        # a closing comment belongs to the method

    def act(self, x):
        return x


def bootstrap(x):
    return x + LOG_TWO
    # a closing comment belongs to the function


def schedule(step, total):
    """The fraction of the learning rate left at `step` of `total`."""
    if total <= 0:
        return 1.0
    left = 1.0 - step / total
    if left < 0:
        return 0.0
    if left > 1:
        return 1.0
    return left
'''


def tiny(tmp_path, files: dict[str, str]):
    """A checkout of small files: ppo.py the source above unless given."""
    for name, text in {"ppo.py": SOURCE, **files}.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def drift_is_caught_and_fixed(root, file, drifted, where):
    """`drifted` in `file` is named at `where`; --fix restores the file as it was before the drift."""
    path = root / file
    good = path.read_text()
    path.write_text(drifted(good))
    result = check(root)
    assert result.returncode == 1 and f"{where} differs from its source" in result.stdout, result.stdout + result.stderr
    assert check(root, "--fix").returncode == 0 and path.read_text() == good
    assert check(root).returncode == 0


def test_a_definition_ends_by_indentation_its_closing_comments_included(tmp_path):
    copy = '''\
    # Copied from ppo.py
    def bootstrap(x):
        return x + LOG_TWO
        # a closing comment belongs to the function
    '''
    root = tiny(tmp_path, {"ippo.py": copy})
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("closing", "final"), "ippo.py:2 bootstrap")
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text + "    # one more\n", "ippo.py:2 bootstrap")
    # a closing comment added to the source reaches the copy
    closing = "    # a closing comment belongs to the function\n"
    (root / "ppo.py").write_text(SOURCE.replace(closing, closing + "    # added in the source\n"))
    assert check(root).returncode == 1
    assert check(root, "--fix").returncode == 0
    assert (root / "ippo.py").read_text().endswith("# added in the source\n")


def test_a_method_is_copied_by_class_and_name_at_any_depth(tmp_path):
    copy = '''\
    class Agent:
        # Copied from ppo.py
        def normalize(self, x):
            return x * HALF
            # a closing comment belongs to the method

        # Copied from ppo.py: Agent.act
        def forward(self, x):
            return x


    class Other:
        # Copied from ppo.py: bootstrap
        def bootstrap(x):
            return x + LOG_TWO
            # a closing comment belongs to the function
    '''
    root = tiny(tmp_path, {"ippo.py": copy})
    assert "ippo.py: 3 marked copies, 0 differing" in check(root).stdout
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("x * HALF", "x / 2"),
                              "ippo.py:3 Agent.normalize")
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("return x\n", "return -x\n"),
                              "ippo.py:8 Agent.forward")
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("+ LOG_TWO", "- LOG_TWO"),
                              "ippo.py:14 Other.bootstrap")


@pytest.mark.parametrize("mark, refusal", [
    ("#Copied from ppo.py", None),
    ("#   Copied from ppo.py", None),
    ("# Copied from ppo", "names no .py file: write '# Copied from ppo.py'"),
    ("# copied from ppo.py", "is not a mark this script reads"),
    ("# Copied from ppo.py with LOG_TWO->LOG_2 all-casing", "is not a replacement A->B"),
    ("# Copied from ppo.py with LOG_THREE->LOG_3", "the replacement LOG_THREE->LOG_3 changes nothing"),
    ("# Copied from ppo.py with x->x", "the replacement x->x changes nothing"),
    ("## Copied from ppo.py", "is not a mark this script reads"),
    ("# NOTE: Copied from ppo.py", "is not a mark this script reads"),
    ("# Copied from ppo.py: Agent.missing", "ppo.py has no definition Agent.missing"),
])
def test_every_variant_of_a_mark_is_read_or_refused_in_one_line(tmp_path, mark, refusal):
    copy = f"{mark}\ndef bootstrap(x):\n    return x + LOG_TWO\n    # a closing comment belongs to the function\n"
    root = tiny(tmp_path, {"ippo.py": copy})
    result = check(root)
    if refusal is None:
        assert "ippo.py: 1 marked copies, 0 differing" in result.stdout
        drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("x +", "x -"), "ippo.py:2 bootstrap")
    else:
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("error: ippo.py:") and refusal in result.stderr, result.stderr


def test_fix_never_writes_a_file_that_does_not_parse(tmp_path):
    copy = "# Copied from ppo.py with +->+(\ndef bootstrap(x):\n    return x - LOG_TWO\n"
    root = tiny(tmp_path, {"ippo.py": copy})
    fixed = check(root, "--fix")
    assert fixed.returncode == 2 and "would not parse" in fixed.stderr and (root / "ippo.py").read_text() == copy


def test_copies_of_copies_settle_in_any_file_order_and_cycles_are_refused(tmp_path):
    # a.py copies from zz.py, which copies from ppo.py: a.py's source comes after it
    copy = ("# check_copies: this file's marks are checked\n# Copied from {}\ndef bootstrap(x):\n"
            "    return x + LOG_TWO\n    # a closing comment belongs to the function\n")
    root = tiny(tmp_path, {"a.py": copy.format("zz.py"), "zz.py": copy.format("ppo.py")})
    assert check(root).returncode == 0
    (root / "ppo.py").write_text(SOURCE.replace("x + LOG_TWO", "x + 2 * LOG_TWO"))
    result = check(root)
    assert "a.py:3 bootstrap differs" in result.stdout and "zz.py:3 bootstrap differs" in result.stdout
    assert check(root, "--fix").returncode == 0 and check(root).returncode == 0
    assert "2 * LOG_TWO" in (root / "a.py").read_text()
    (root / "zz.py").write_text(copy.format("a.py"))  # a.py <-> zz.py, drifting alike
    cycle = check(root)
    assert cycle.returncode == 2 and "a cycle of copies" in cycle.stderr


def test_a_new_trainer_is_checked_once_it_declares_itself(tmp_path):
    copy = ("# Copied from ppo.py\ndef bootstrap(x):\n    return x + LOG_TWO\n"
            "    # a closing comment belongs to the function\n")
    root = tiny(tmp_path, {"ppo_new_trainer.py": copy.replace("+", "-")})
    assert check(root).returncode == 0  # not the project's own, not declared: not checked
    (root / "ppo_new_trainer.py").write_text("# check_copies: this file's marks are checked\n" + copy)
    drift_is_caught_and_fixed(root, "ppo_new_trainer.py", lambda text: text.replace("+", "-"),
                              "ppo_new_trainer.py:3 bootstrap")


@pytest.mark.parametrize("trainer", ("ppo.py", *SIBLINGS))
def test_a_researchers_copy_of_any_trainer_is_its_own_file(tmp_path, trainer):
    root = checkout(tmp_path)
    text = (root / trainer).read_text()
    (root / "my_idea.py").write_text(text)  # cp ppo_rnn.py my_idea.py: the marks and near-twins of a sibling
    assert check(root).returncode == 0, check(root).stdout
    edited = text.replace("        return terminated | truncated\n", "        return terminated  # my idea\n", 1)
    assert edited != text
    (root / "my_idea.py").write_text(edited)  # a marked definition of the siblings, bootstrap_mask()
    result = check(root, "--fix")  # the researcher's edit is theirs: neither reported nor overwritten
    assert result.returncode == 0 and "my_idea.py" not in result.stdout
    assert (root / "my_idea.py").read_text() == edited


def test_module_constants_are_copied_as_a_block_of_assignments(tmp_path):
    copy = "import math\n\n# Copied from ppo.py\nLOG_TWO = math.log(2)\nHALF = 0.5\n\nOWN = 1\n"
    root = tiny(tmp_path, {"ippo.py": copy})
    assert "ippo.py: 1 marked copies, 0 differing" in check(root).stdout
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("HALF = 0.5", "HALF = 0.25"),
                              "ippo.py:4 LOG_TWO")


def test_a_new_unmarked_near_twin_fails_until_marked_or_listed(tmp_path):
    twin = "def " + SOURCE.split("def ")[-1].replace("return 0.0", "return 0.0  # none left")
    root = tiny(tmp_path, {"ippo.py": "# Copied from ppo.py\nHALF = 0.5\n\n\n" + twin,
                           "my_idea.py": SOURCE.replace("return 0.0", "return 0.1")})  # a researcher's, unmarked
    result = check(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ippo.py schedule is 0.90 like ppo.py's and unmarked" in result.stdout
    assert "intended_differences.txt" in result.stdout
    (root / "scripts").mkdir()
    listed = root / "scripts/intended_differences.txt"
    listed.write_text("# file name: why\nippo.py schedule: its comment says more\n")
    assert check(root).returncode == 0
    assert "ippo.py schedule: 0.90 like ppo.py schedule: listed (its comment says more)" in \
        check(root, "--report").stdout
    (root / "ippo.py").write_text("# Copied from ppo.py\nHALF = 0.5\n\n\ndef own(x):\n    return x\n")
    stale = check(root)
    assert stale.returncode == 1 and "lists ippo.py schedule, which is no longer" in stale.stdout


def test_the_trainers_unmarked_near_twins_are_all_listed():
    report = check(REPO, "--report")
    assert report.returncode == 0, report.stdout + report.stderr
    assert "UNLISTED" not in report.stdout


@pytest.mark.parametrize("copy, refusal", [
    ("def bootstrap(x):  # Copied from ppo.py\n    return x + LOG_TWO\n", "must stand on a line of its own"),
    ("def outer():\n    # Copied from ppo.py: bootstrap\n    def bootstrap(x):\n        return x\n",
     "must stand directly above a def or class of the module or of a class"),
    ("class C:\n    @property\n    def x(self):\n        return 1\n\n    # Copied from ppo.py: Agent.act\n"
     "    @x.setter\n    def x(self, value):\n        return value\n", "defines C.x more than once"),
])
def test_a_mark_that_could_mark_nothing_is_refused(tmp_path, copy, refusal):
    result = check(tiny(tmp_path, {"ippo.py": copy}))
    assert result.returncode == 2 and refusal in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_a_copy_renamed_by_its_replacements_settles(tmp_path):
    copy = ("# Copied from ppo.py: Agent with Agent->RecurrentAgent\nclass RecurrentAgent:\n"
            "    def normalize(self, x):\n        return x\n")
    root = tiny(tmp_path, {"ippo.py": copy})
    assert check(root, "--fix").returncode == 0
    fixed = (root / "ippo.py").read_text()
    assert "class RecurrentAgent:\n" in fixed and "return x * HALF" in fixed and check(root).returncode == 0


def test_fix_writes_every_file_or_none(tmp_path):
    good = "# Copied from ppo.py\ndef bootstrap(x):\n    return x - LOG_TWO\n"
    bad = "# Copied from ppo.py with +->+(\ndef bootstrap(x):\n    return x - LOG_TWO\n"
    root = tiny(tmp_path, {"ippo.py": good, "ppo_rnn.py": bad})
    result = check(root, "--fix")
    assert result.returncode == 2 and "(fixed)" not in result.stdout
    assert (root / "ippo.py").read_text() == good and (root / "ppo_rnn.py").read_text() == bad


def test_a_run_of_constants_ends_at_code(tmp_path):
    source = SOURCE.replace("HALF = 0.5\n", "HALF = 0.5\nprint(HALF)\nTHIRD = 1 / 3\n")
    copy = "import math\n\n# Copied from ppo.py\nLOG_TWO = math.log(2)\nHALF = 0.5\nprint('own')\nTHIRD = 0.3\n"
    root = tiny(tmp_path, {"ppo.py": source, "ippo.py": copy})
    assert check(root).returncode == 0  # the run is LOG_TWO and HALF: what follows the call is the copy's own


def test_a_renamed_copy_keeps_its_header_aligned(tmp_path):
    source = SOURCE + "\n\ndef clip(value, low,\n         high):\n    return min(max(value, low), high)\n"
    copy = ("# Copied from ppo.py: clip\ndef clamp_to(value, low,\n             high):\n"
            "    return min(max(value, low), high)\n")
    root = tiny(tmp_path, {"ppo.py": source, "ippo.py": copy})
    assert check(root).returncode == 0
    drift_is_caught_and_fixed(root, "ippo.py", lambda text: text.replace("             high", "    high"),
                              "ippo.py:2 clamp_to")


def test_a_mark_above_the_wrong_definition_is_named_so(tmp_path):
    copy = "# Copied from ppo.py: bootstrap\ndef unrelated(table):\n    for row in table:\n        print(row)\n"
    result = check(tiny(tmp_path, {"ippo.py": copy}))
    assert result.returncode == 1 and "is the mark above the right definition?" in result.stdout, result.stdout
    assert f"--fix --root {tmp_path} rewrites them" in result.stdout
