"""The documentation's relative links lead somewhere: README.md, docs/*.md and benchmarks/README.md.

Every markdown link [text](path) or [text](path#anchor) that is not a URL must name an existing file or directory,
relative to the file that holds it, and an #anchor must be the slug of a heading of its target, as GitHub makes
them: lowercase, punctuation dropped (hyphens, underscores and spaces kept), spaces to hyphens, a repeated heading
suffixed -1, -2, ... Links and headings inside code are not links and not headings.
"""

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

README_MAX_LINES = 350

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; text may hold one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif fenced == match.group(1):
                fenced = None
            continue
        if fenced is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)  # drops backticks, *, :, ., ', (, ) ...; keeps letters, digits, _, -, space
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path):
    """(line number, target) of every link outside code."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in links(path):
        where = f"{path.relative_to(REPO)}:{number}: ({target})"
        if not target or EXTERNAL.match(target):
            if not target:
                broken.append(f"{where} empty link")
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{where} no such file or directory: {os.path.relpath(resolved, REPO)}")
            continue
        if anchor:
            if resolved.is_dir() or resolved.suffix.lower() != ".md":
                broken.append(f"{where} an anchor into something that is not a markdown file")
            elif anchor not in anchors(resolved):
                broken.append(f"{where} no heading #{anchor} in {resolved.relative_to(REPO)}")
    return broken


def test_slug_follows_github():
    assert slug("Recurrent PPO: `ppo_rnn.py`") == "recurrent-ppo-ppo_rnnpy"
    assert slug("Many GPUs and long runs: torchrun") == "many-gpus-and-long-runs-torchrun"
    assert slug("`--async_envs` on MuJoCo") == "--async_envs-on-mujoco"
    assert slug("Speed at CleanRL's MuJoCo settings") == "speed-at-cleanrls-mujoco-settings"
    assert slug("Sweeps, tables and plots") == "sweeps-tables-and-plots"


def test_every_relative_link_resolves():
    files = doc_files()
    missing = [str(path.relative_to(REPO)) for path in files if not path.is_file()]
    assert not missing, f"documentation files missing: {missing}"
    broken = [line for path in files for line in broken_links(path)]
    assert not broken, f"{len(broken)} broken link(s):\n" + "\n".join(broken)


def test_readme_is_short():
    lines = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, at most {README_MAX_LINES}: move details to "
                                       f"docs/ or benchmarks/README.md")
