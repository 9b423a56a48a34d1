"""The recipes in recipes/: PPO variants as patches onto a trainer, each a researcher's starting point for an idea of
its kind (docs/recipes.md). A recipe is a unified diff of the trainer (--- a/ppo.py) with a few lines of text above
it: what the idea changes and where, its paper, how to run it. `patch` applies it to a fresh copy:

    cp ppo.py my_rpo.py && patch my_rpo.py recipes/rpo.patch         # the copy, then the recipe (or:)
    python scripts/recipes.py apply rpo my_rpo.py                       # the same without patch(1)
    python scripts/recipes.py check                                     # every recipe applies to today's trainer
    python scripts/recipes.py refresh                                   # after a change to a trainer, below
    python scripts/recipes.py write rpo my_rpo.py                       # (re)write a recipe from an edited copy

A recipe applies where each of its hunks' old lines stand in the trainer, anywhere (a change elsewhere in the file
only moves it). A change to the trainer inside a hunk's lines breaks it: `check` says which hunk, and `refresh`
merges the recipe onto today's trainer (git merge-file, from the trainer the recipe was written against, which its
index line names by git blob) and writes it anew; a merge that conflicts is left to the author, in one line.
Exits 1 where a recipe does not apply or merge, 2 on bad input.
"""

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)\nindex ([0-9a-f]{40})\.\.([0-9a-f]{40})", re.MULTILINE)
# git's python function context: the hunk header names the def or class the hunk stands in
FUNCTION = re.compile(r"^[ \t]*((class|(async[ \t]+)?def)[ \t].*)$")
CONTEXT_LINES = 3


class RecipeError(Exception):
    pass


def parse(path: Path) -> tuple[str, str, str, list[tuple[int, list[str], list[str]]]]:
    """A recipe's text above its diff, its trainer, the trainer's git blob it was written against, and its hunks:
    (line of the old lines, old lines, new lines)."""
    text = path.read_text()
    header = HEADER.search(text)
    if header is None:
        raise RecipeError(f"{path} holds no 'diff --git a/TRAINER b/NAME' with a full 'index BLOB..BLOB' line: write "
                          "it with python scripts/recipes.py write")
    hunks, left = [], [0, 0]  # the old and new lines the hunk's header announces and are still to come
    for line in text[header.end():].splitlines(keepends=True):
        found = HUNK.match(line)
        if found and left == [0, 0]:
            hunks.append((int(found.group(1)), [], []))
            left = [int(found.group(2) or 1), int(found.group(4) or 1)]
            continue
        if left == [0, 0]:
            continue
        kind, body = (" ", "\n") if line == "\n" else (line[:1], line[1:])  # a blank context line an editor stripped
        if kind in (" ", "-"):
            hunks[-1][1].append(body)
            left[0] -= 1
        if kind in (" ", "+"):
            hunks[-1][2].append(body)
            left[1] -= 1
    return text[:header.start()], header.group(1), header.group(3), hunks


def apply(source: str, path: Path) -> str:
    """source with the recipe applied: each hunk where its old lines stand exactly, the nearest to its line number
    after the previous hunk's."""
    lines = source.splitlines(keepends=True)
    out, at = [], 0
    for number, (start, old, new) in enumerate(parse(path)[3], 1):
        found = [i for i in range(at, len(lines) - len(old) + 1) if lines[i:i + len(old)] == old]
        if not found:
            first = next((line.strip() for line in old if line.strip()), "")
            raise RecipeError(f"{path.name}: hunk {number} (line {start}, at '{first[:60]}') no longer matches "
                              f"the trainer: python scripts/recipes.py refresh {path.stem}")
        position = min(found, key=lambda i: abs(i - (start - 1)))
        out += lines[at:position] + new
        at = position + len(old)
    return "".join(out + lines[at:])


def blob(text: str, store: bool = False) -> str:
    """The text's git blob hash (store: also written into the repository's objects, for a later refresh)."""
    return git(["hash-object", "--stdin", *(["-w"] if store else [])], text).strip()


def git(arguments: list[str], stdin: str = "", check: bool = True) -> str:
    result = subprocess.run(["git", "-C", str(REPO), *arguments], input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RecipeError(f"git {' '.join(arguments)}: {result.stderr.strip()}")
    return result.stdout


def diff(header: str, trainer: str, name: str, old: str, new: str) -> str:
    """header above a unified diff from the trainer's text to the copy's, with git's python function context after
    each hunk's line numbers (cut to 120 columns)."""
    old_lines = old.splitlines(keepends=True)
    hunks = []
    for line in difflib.unified_diff(old_lines, new.splitlines(keepends=True), n=CONTEXT_LINES):
        found = HUNK.match(line)
        if found:
            start = int(found.group(1)) - 1
            context = next((m.group(1) for m in map(FUNCTION.match, reversed(old_lines[:start])) if m), "")
            line = f"{line.rstrip()} {context}".rstrip()[:120] + "\n"
        hunks.append(line)
    index = f"diff --git a/{trainer} b/{name}.py\nindex {blob(old, store=True)}..{blob(new)} 100644\n"
    return header + index + f"--- a/{trainer}\n+++ b/{name}.py\n" + "".join(hunks[2:])


def recipe_path(name: str) -> Path:
    path = REPO / "recipes" / f"{Path(name).stem}.patch"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (REPO / "recipes").glob("*.patch")))
        raise ValueError(f"no recipe {name}: recipes/ holds {known}")
    return path


def refresh(path: Path, root: Path) -> bool:
    """Merge the recipe onto today's trainer; whether it changed."""
    header, trainer, base_blob, _ = parse(path)
    today = (root / trainer).read_text()
    base = git(["cat-file", "blob", base_blob], check=False)
    if not base:  # a shallow clone, a pruned object: where the recipe still applies, today's trainer is its base
        try:
            base, ours = today, apply(today, path)
        except RecipeError:
            raise RecipeError(f"{path.name}: the recipe no longer applies, and the {trainer} it was written against "
                              f"(git blob {base_blob[:12]}) is not in this repository (a shallow clone?): fetch the "
                              f"history, or merge by hand and write it: python scripts/recipes.py write {path.stem} "
                              "YOUR_COPY") from None
    else:
        ours = apply(base, path)
    with tempfile.TemporaryDirectory() as folder:
        files = [Path(folder) / name for name in ("today", "base", "recipe")]
        for file, text in zip(files, (today, base, ours)):
            file.write_text(text)
        merged = subprocess.run(["git", "merge-file", "-p", *map(str, files)], capture_output=True, text=True)
    if not 0 <= merged.returncode < 128:
        raise RecipeError(f"{path.name}: git merge-file failed: {merged.stderr.strip()}")
    if merged.returncode != 0:
        raise RecipeError(f"{path.name}: the recipe conflicts with today's {trainer} in {merged.returncode} place(s): "
                          f"apply it to the {trainer} of git blob {base_blob[:12]}, merge by hand, then python "
                          f"scripts/recipes.py write {path.stem} YOUR_COPY")
    new = diff(header, trainer, path.stem, today, merged.stdout)
    changed = new != path.read_text()
    path.write_text(new)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    applying = commands.add_parser("apply", help="write a fresh copy of the trainer with the recipe applied")
    applying.add_argument("recipe")
    applying.add_argument("copy", type=Path)
    checking = commands.add_parser("check", help="every recipe (or those named) applies to today's trainer")
    checking.add_argument("recipes", nargs="*")
    refreshing = commands.add_parser("refresh", help="merge recipes onto today's trainer and write them anew")
    refreshing.add_argument("recipes", nargs="*")
    writing = commands.add_parser("write", help="write a recipe as the diff of an edited copy from its trainer")
    writing.add_argument("recipe")
    writing.add_argument("copy", type=Path)
    writing.add_argument("--trainer", default="ppo.py", help="the trainer the copy was made of (a new recipe)")
    args = parser.parse_args()
    try:
        if args.command == "apply":
            path = recipe_path(args.recipe)
            if args.copy.exists():
                raise ValueError(f"{args.copy} exists: name a new file")
            args.copy.write_text(apply((REPO / parse(path)[1]).read_text(), path))
            print(f"{args.copy}: {parse(path)[1]} with the recipe {path.stem}")
            return 0
        if args.command == "write":
            path = REPO / "recipes" / f"{Path(args.recipe).stem}.patch"
            header, trainer = (parse(path)[:2] if path.exists() else
                               (f"{path.stem}: WHAT IT CHANGES, WHERE, THE PAPER\n\n", args.trainer))
            path.write_text(diff(header, trainer, path.stem, (REPO / trainer).read_text(), args.copy.read_text()))
            print(f"{path.relative_to(REPO)}: {args.copy} against today's {trainer}")
            return 0
        names = args.recipes or sorted(p.stem for p in (REPO / "recipes").glob("*.patch"))
        failed = []
        for name in names:
            path = recipe_path(name)
            try:
                if args.command == "check":
                    apply((REPO / parse(path)[1]).read_text(), path)
                    print(f"{path.stem}: applies")
                else:
                    print(f"{path.stem}: {'refreshed' if refresh(path, REPO) else 'unchanged'}")
            except RecipeError as e:
                print(f"error: {e}")
                failed.append(name)
        return 1 if failed else 0
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
