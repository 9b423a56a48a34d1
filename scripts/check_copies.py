"""Keep the trainers' copied definitions equal to their source, as Hugging Face transformers' utils/check_copies.py
keeps its models' copies.

A top-level def or class of a trainer that another file holds verbatim carries a comment line directly above it
(above its decorators):

    # Copied from ppo.py                      the definition of the same name in ppo.py
    # Copied from ppo.py: NAME                ppo.py's NAME, named as the copy is
    # Copied from ppo.py with A->B, C->D      the source's text with each A replaced by B, then C by D

The copy must equal its source's text exactly, comments and blank lines inside it included.

    python scripts/check_copies.py          # each copy that differs from its source: file, line, name; exit 1
    python scripts/check_copies.py --fix    # rewrite those copies from their source
    python scripts/check_copies.py --root DIR   # the trainers of another checkout (the tests' drifted copies)

A researcher's own copy (cp ppo.py my_idea.py) is none of the project's files and is never checked.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

FILES = ("ppo.py", "ppo_rnn.py", "ppo_rgb.py", "ippo.py", "ppo_eval.py")
MARKER = re.compile(r"^# Copied from (?P<source>[\w.]+\.py)(?::\s*(?P<name>\w+))?(?:\s+with\s+(?P<pairs>.+?))?\s*$")


def definitions(text: str, filename: str = "<source>") -> dict[str, tuple[int, int]]:
    """Each top-level def and class: name -> (first line index, its decorators included; index past its last)."""
    spans = {}
    for node in ast.parse(text, filename).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            spans[node.name] = (first - 1, node.end_lineno)
    return spans


def replacements(pairs: str) -> list[tuple[str, str]]:
    result = []
    for pair in pairs.split(","):
        old, arrow, new = pair.strip().partition("->")
        if not arrow or not old:
            raise ValueError(f"replacement {pair.strip()!r} is not A->B")
        result.append((old, new))
    return result


def copies(root: Path, path: Path) -> list[dict]:
    """The marked copies of one file, each with its span and the text its source says it must have."""
    lines = path.read_text().splitlines(keepends=True)
    sources, found = {}, []
    spans = definitions("".join(lines), path.name)
    markers = {i for i, line in enumerate(lines) if MARKER.match(line.rstrip("\n"))}
    if strays := sorted(markers - {first - 1 for first, _ in spans.values()}):
        raise ValueError(f"{path.name}:{strays[0] + 1}: a 'Copied from' line must stand directly above a top-level "
                         "def or class (or its decorators)")
    for name, (first, end) in spans.items():
        match = MARKER.match(lines[first - 1].rstrip("\n")) if first > 0 else None
        if match is None:
            continue
        source_path = root / match["source"]
        where = f"{path.name}:{first + 1} {name}"
        if not source_path.is_file():
            raise ValueError(f"{where}: its source {match['source']} is not in {root}")
        if source_path not in sources:
            source_text = source_path.read_text()
            sources[source_path] = (source_text.splitlines(keepends=True), definitions(source_text, source_path.name))
        source_lines, source_spans = sources[source_path]
        source_name = match["name"] or name
        if source_name not in source_spans:
            raise ValueError(f"{where}: {match['source']} has no top-level {source_name}")
        source_first, source_end = source_spans[source_name]
        expected = "".join(source_lines[source_first:source_end])
        if source_name != name:  # the copy's own name in its def or class line, and nowhere else
            expected = re.sub(rf"^((?:async )?def|class) {source_name}\b", rf"\1 {name}", expected, count=1,
                              flags=re.MULTILINE)
        if not expected.endswith("\n"):  # a source that ends its file without one
            expected += "\n"
        for old, new in replacements(match["pairs"]) if match["pairs"] else []:
            expected = expected.replace(old, new)
        found.append({"where": where, "span": (first, end), "expected": expected,
                      "differs": "".join(lines[first:end]) != expected})
    return found


def check(root: Path, fix: bool) -> int:
    drifted = 0
    for file in FILES:
        path = root / file
        if not path.is_file():
            continue
        marked = copies(root, path)
        stale = [copy for copy in marked if copy["differs"]]
        for copy in stale:
            print(f"{copy['where']} differs from its source{' (fixed)' if fix else ''}")
        drifted += len(stale)
        if marked:
            print(f"{file}: {len(marked)} marked copies, {len(stale)} differing")
        if fix and stale:
            lines = path.read_text().splitlines(keepends=True)
            for copy in sorted(stale, key=lambda c: -c["span"][0]):  # from the bottom: earlier spans stay put
                first, end = copy["span"]
                lines[first:end] = [copy["expected"]]
            path.write_text("".join(lines))
    if drifted and not fix:
        print(f"{drifted} copies differ from their source: python scripts/check_copies.py --fix rewrites them")
    return 1 if drifted and not fix else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fix", action="store_true", help="rewrite the copies that differ from their source")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose trainers to check (default: this one)")
    args = parser.parse_args()
    try:
        return check(args.root, args.fix)
    except (ValueError, SyntaxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
