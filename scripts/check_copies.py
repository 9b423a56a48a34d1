"""Keep the trainers' copied definitions equal to their source, as Hugging Face transformers' utils/check_copies.py
keeps its models' copies.

A definition that another file holds verbatim carries a comment line directly above it (above its decorators), at
its own indentation:

    # Copied from ppo.py                      the definition of the same name in ppo.py
    # Copied from ppo.py: NAME                ppo.py's NAME, named as the copy is
    # Copied from ppo.py: Agent.forward       a method, named by its class (a marker above a method copies ppo.py's
                                              method of the same class and name)
    # Copied from ppo.py with A->B, C->D      the source's text with each A replaced by B, then C by D (no spaces
                                              inside A or B; each must change the text)

A definition is a def or a class (its decorators and every line indented below it, comments included), or a run of
module-level assignments (NAME = ...) up to the first blank line. A copy must equal its source's text exactly,
comments and blank lines inside it included, re-indented when it stands at another depth. A copy of a copy is
checked against its first source; a cycle of copies is refused.

An unmarked definition that has a near-twin of the same name in another of those files (difflib ratio >= 0.9) must
be a marked copy or be named, with its reason, in scripts/intended_differences.txt: the check fails on a new one.

    python scripts/check_copies.py          # each copy that differs from its source: file, line, name; exit 1
    python scripts/check_copies.py --fix    # rewrite those copies from their source
    python scripts/check_copies.py --report # the unmarked near-twins, listed or not, with their similarity
    python scripts/check_copies.py --root DIR   # the files of another checkout (the tests' drifted copies)

The checked files are the project's own at the checkout's root (OWN_FILES) and any other .py file there that
declares itself with a line of its own reading exactly DECLARATION (a new trainer, until it joins OWN_FILES). A
researcher's copy (cp ppo_rnn.py my_idea.py) keeps its source's marks but is its own file: it is not checked, and
its edits of a marked definition are neither reported nor overwritten by --fix.
"""

import argparse
import ast
import difflib
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

LOOSE_MARKER = re.compile(r"\bcopied\s+from\b", re.IGNORECASE)  # any comment saying so is a mark, or refused
MARKER = re.compile(r"#\s*Copied from (?P<source>[\w./-]+?)(?::\s*(?P<name>[\w.]+))?(?:\s+with\s+(?P<pairs>.+?))?\s*$")
PAIR = re.compile(r"(?P<old>\S+?)->(?P<new>\S*)")
ALLOWED = "intended_differences.txt"
OWN_FILES = ("ppo.py", "ppo_rnn.py", "ppo_rgb.py", "ippo.py", "ppo_eval.py")
DECLARATION = "# check_copies: this file's marks are checked"
NEAR_TWIN = 0.9
UNLIKE = 0.5  # a drifted copy less alike than this is named as perhaps marked by mistake
FIX_PASSES = 5  # a copy nested in a class that is copied elsewhere settles in a second pass; more is refused


class CopyError(ValueError):
    pass


@dataclass
class Definition:
    name: str  # qualified: Class.method
    first: int  # line index of its first line (a decorator's, for a decorated def)
    end: int  # line index past its last line
    indent: str
    marker: "re.Match | None" = None


def indent_of(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def block_end(lines: list[str], last: int, column: int) -> int:
    """Past the definition that ends on line index `last` by the AST: the lines below indented deeper than its
    header (comments too) belong to it, trailing blank lines do not."""
    end = last + 1
    while end < len(lines) and (not lines[end].strip() or len(indent_of(lines[end])) > column):
        end += 1
    while end > last + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def marker_lines(text: str, filename: str) -> dict[int, str]:
    """Line index -> comment, for each comment that reads like a 'Copied from' mark; one that does not stand alone on
    its line would mark nothing, and is refused."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT and LOOSE_MARKER.search(token.string):
            if token.line[:token.start[1]].strip():
                raise CopyError(f"{filename}:{token.start[0]}: a 'Copied from' mark must stand on a line of its own, "
                                "directly above what it marks")
            found[token.start[0] - 1] = token.string
    return found


def definitions(text: str, filename: str) -> tuple[list[str], dict[str, Definition]]:
    """The file's lines and its definitions by qualified name, each with the mark standing directly above it."""
    tree = ast.parse(text, filename)
    lines = text.splitlines(keepends=True)
    marks = marker_lines(text, filename)
    spans: dict[str, Definition] = {}
    owners: dict[int, Definition] = {}  # by the line above each definition, the one a mark stands on

    def add(name: str, first: int, end: int) -> None:
        definition = Definition(name, first, end, indent_of(lines[first]))
        owners.setdefault(first - 1, definition)
        spans.setdefault(name, definition)

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]) - 1
                add(prefix + node.name, first, block_end(lines, node.end_lineno - 1, node.col_offset))
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    assignments = [node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))]
    for i, node in enumerate(assignments):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if not isinstance(target, ast.Name):
            continue
        end = block_end(lines, node.end_lineno - 1, 0)
        for following in assignments[i + 1:]:  # the run goes on over comment lines, to anything else or a mark
            between = lines[end:following.lineno - 1]
            if following.lineno - 1 < end or not all(line.strip().startswith("#") for line in between) or \
                    any(end + j in marks for j in range(len(between))):
                break
            end = block_end(lines, following.end_lineno - 1, 0)
        add(target.id, node.lineno - 1, end)
    for index, comment in sorted(marks.items()):
        where = f"{filename}:{index + 1}"
        match = MARKER.fullmatch(comment)
        if match is None:
            raise CopyError(f"{where}: {comment!r} is not a mark this script reads: write '# Copied from ppo.py', "
                            "'# Copied from ppo.py: NAME' or '# Copied from ppo.py with A->B'")
        if not match["source"].endswith(".py"):
            raise CopyError(f"{where}: {comment!r} names no .py file: write '# Copied from {match['source']}.py'")
        owner = owners.get(index)
        if owner is None or owner.indent != indent_of(lines[index]):
            raise CopyError(f"{where}: a 'Copied from' line must stand directly above a def or class of the module or "
                            "of a class, or a module's assignment (or their decorators), at its indentation")
        if spans[owner.name] is not owner:
            raise CopyError(f"{where}: {filename} defines {owner.name} more than once, so a mark cannot say which; "
                            "give the copy a name of its own")
        owner.marker = match
    return lines, spans


def replacements(pairs: str, where: str) -> list[tuple[str, str]]:
    result = []
    for pair in pairs.split(","):
        match = PAIR.fullmatch(pair.strip())
        if match is None:
            raise CopyError(f"{where}: {pair.strip()!r} is not a replacement A->B (no spaces inside A or B; "
                            "no options after them)")
        result.append((match["old"], match["new"]))
    return result


def renamed(text: str, old: str, new: str) -> str:
    """A definition's text with the name in its header made new; a def's or class's continuation lines, aligned
    under its opening bracket, move with the name."""
    lines = text.splitlines(keepends=True)
    header = re.compile(rf"^(\s*(?:(?:async\s+)?def\s+|class\s+)){old}\b|^(\s*){old}(?=\s*[:=])")
    first = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if first is None:  # the mark's replacements named it already
        return text
    lines[first] = header.sub(lambda match: (match[1] or match[2]) + new, lines[first], count=1)
    last = first
    while lines[first].lstrip().startswith(("def ", "async ", "class ")) and not lines[last].rstrip().endswith(":"):
        last += 1
        pad = indent_of(lines[last])
        lines[last] = " " * max(0, len(pad) + len(new) - len(old)) + lines[last][len(pad):]
    return "".join(lines)


class Checkout:
    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, tuple[list[str], dict[str, Definition]]] = {}
        self.resolved: dict[tuple[str, str], str] = {}

    def read(self, file: str) -> tuple[list[str], dict[str, Definition]]:
        if file not in self.files:
            path = self.root / file
            if not path.is_file():
                raise FileNotFoundError(file)
            self.files[file] = definitions(path.read_text(), file)
        return self.files[file]

    def text(self, file: str, name: str) -> str:
        lines, spans = self.read(file)
        definition = spans[name]
        return "".join(lines[definition.first:definition.end])

    def expected(self, file: str, name: str, chain: tuple = ()) -> str:
        """The text the definition must have: its own if unmarked, else its source's (resolved first), transformed."""
        key = (file, name)
        if key in chain:
            cycle = " -> ".join(f"{f} {n}" for f, n in (*chain[chain.index(key):], key))
            raise CopyError(f"a cycle of copies: {cycle}: one of them must be the source, without a mark")
        if key in self.resolved:
            return self.resolved[key]
        lines, spans = self.read(file)
        definition = spans[name]
        if definition.marker is None:
            return self.text(file, name)
        match, where = definition.marker, f"{file}:{definition.first + 1} {name}"
        source_file, source_name = match["source"], match["name"] or name
        try:
            _, source_spans = self.read(source_file)
        except FileNotFoundError:
            raise CopyError(f"{where}: its source {source_file} is not in {self.root}") from None
        if source_name not in source_spans:
            raise CopyError(f"{where}: {source_file} has no definition {source_name}")
        text = self.expected(source_file, source_name, (*chain, key))
        source_indent = source_spans[source_name].indent
        if source_indent != definition.indent:
            moved = []
            for line in text.splitlines(keepends=True):
                if line.strip() and not line.startswith(source_indent):
                    raise CopyError(f"{where}: {source_file} {source_name} cannot be re-indented (a line of it "
                                    "stands left of its header)")
                moved.append(definition.indent + line[len(source_indent):] if line.strip() else line)
            text = "".join(moved)
        if not text.endswith("\n"):  # a source that ends its file without one
            text += "\n"
        for old, new in replacements(match["pairs"], where) if match["pairs"] else []:
            if old not in text or old == new:
                raise CopyError(f"{where}: the replacement {old}->{new} changes nothing in {source_file} "
                                f"{source_name}: drop it")
            text = text.replace(old, new)
        # the copy's own name in its header, and nowhere else; after the replacements, which may have named it
        own, theirs = name.rpartition(".")[2], source_name.rpartition(".")[2]
        if own != theirs:
            text = renamed(text, theirs, own)
        self.resolved[key] = text
        return text

    def copies(self, file: str) -> list[dict]:
        """The file's marked copies, outermost only (a copy inside a copied class is checked as part of it)."""
        lines, spans = self.read(file)
        marked = sorted((d for d in spans.values() if d.marker is not None), key=lambda d: (d.first, -d.end))
        found, outer_end = [], -1
        for definition in marked:
            if definition.first < outer_end:
                continue
            outer_end = definition.end
            expected = self.expected(file, definition.name)
            found.append({"where": f"{file}:{definition.first + 1} {definition.name}", "expected": expected,
                          "span": (definition.first, definition.end),
                          "differs": "".join(lines[definition.first:definition.end]) != expected})
        return found

    def near_twins(self) -> list[tuple[str, str, str, float]]:
        """(file, name, twin's file, similarity) for each unmarked definition with an unmarked near-twin of the same
        name in a file before it (ppo.py first, then by name; files with marks only); a method only where its class
        is no near-twin."""
        marked = [file for file in self.files if any(d.marker for d in self.read(file)[1].values())]
        # a checked file without marks copies nothing: only ppo.py is a source regardless
        order = sorted({"ppo.py", *marked} & self.files.keys(), key=lambda file: (file != "ppo.py", file))
        found = []
        for position, file in enumerate(order):
            reported = set()
            for name, definition in sorted(self.read(file)[1].items(), key=lambda item: item[0].count(".")):
                if definition.marker is not None or self.inside_copy(file, definition) or \
                        name.rpartition(".")[0] in reported:
                    continue
                ours, best = self.text(file, name).splitlines(), None
                for other in order[:position]:
                    twin = self.read(other)[1].get(name)
                    if twin is None or twin.marker is not None:
                        continue
                    ratio = difflib.SequenceMatcher(None, ours, self.text(other, name).splitlines(),
                                                    autojunk=False).ratio()
                    if ratio >= NEAR_TWIN and (best is None or ratio > best[1]):
                        best = (other, ratio)
                if best:
                    found.append((file, name, *best))
                    reported.add(name)
        return found

    def inside_copy(self, file: str, definition: Definition) -> bool:
        return any(d.marker is not None and d.first < definition.first < d.end for d in self.read(file)[1].values())


def unlike(checkout: Checkout, file: str, copy: dict) -> str:
    """A note where a copy is far from its source: a mark above the wrong definition, which --fix would overwrite."""
    first, end = copy["span"]
    ratio = difflib.SequenceMatcher(None, checkout.files[file][0][first:end], copy["expected"].splitlines(True),
                                    autojunk=False).ratio()
    return f" (only {ratio:.2f} alike: is the mark above the right definition?)" if ratio < UNLIKE else ""


def intended_differences(root: Path) -> dict[tuple[str, str], str]:
    """scripts/intended_differences.txt: 'FILE NAME: why it is not a copy', one a line; '#' starts a comment."""
    path = root / "scripts" / ALLOWED
    listed = {}
    for number, line in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, colon, reason = line.partition(":")
        if not colon or len(key.split()) != 2 or not reason.strip():
            raise CopyError(f"scripts/{ALLOWED}:{number}: write 'FILE NAME: the reason it is not a copy'")
        file, name = key.split()
        listed[(file, name)] = reason.strip()
    return listed


def checked_files(root: Path) -> list[str]:
    """The project's own files at root, and those that declare themselves (DECLARATION)."""
    return sorted(path.name for path in root.glob("*.py")
                  if path.name in OWN_FILES or DECLARATION in path.read_text().splitlines())


def check(root: Path, fix: bool, report: bool) -> int:
    checkout = Checkout(root)
    files = checked_files(root)
    drifted, first_pass = 0, []  # what the first pass found, printed once --fix has written it
    for _ in range(FIX_PASSES if fix else 1):
        checkout.files.clear()
        checkout.resolved.clear()
        stale_now = {}
        for file in files:
            marked = checkout.copies(file)
            stale = [copy for copy in marked if copy["differs"]]
            stale_now[file] = stale
            if marked and not drifted:
                first_pass += [f"{copy['where']} differs from its source{unlike(checkout, file, copy)}"
                               f"{' (fixed)' if fix else ''}" for copy in stale]
                first_pass.append(f"{file}: {len(marked)} marked copies, {len(stale)} differing")
        drifted += sum(len(stale) for stale in stale_now.values())
        if not fix or not any(stale_now.values()):
            break
        fixed = {}  # every file's new text parses before any is written
        for file, stale in stale_now.items():
            lines = checkout.files[file][0][:]
            for copy in sorted(stale, key=lambda c: -c["span"][0]):  # from the bottom: earlier spans stay put
                first, end = copy["span"]
                lines[first:end] = [copy["expected"]]
            try:
                ast.parse(fixed.setdefault(file, "".join(lines)), file)
            except SyntaxError as e:
                raise CopyError(f"{file}: the fixed file would not parse (line {e.lineno}: {e.msg}); nothing written "
                                "in this pass: correct the mark's replacements") from None
        for file, text in fixed.items():
            if stale_now[file]:
                (root / file).write_text(text)
    else:  # a copy whose expected text changes with each rewrite (its mark renames what it copies) never settles
        raise CopyError(f"the copies did not settle in {FIX_PASSES} passes of --fix")
    if first_pass:
        print("\n".join(first_pass))
    if drifted and not fix:
        root_flag = "" if root.resolve() == Path(__file__).resolve().parent.parent else f" --root {root}"
        print(f"{drifted} copies differ from their source: python scripts/check_copies.py --fix{root_flag} rewrites "
              "them")
    twins = checkout.near_twins()
    listed = intended_differences(root)
    unlisted = [twin for twin in twins if (twin[0], twin[1]) not in listed]
    if report:
        for file, name, other, ratio in twins:
            reason = listed.get((file, name))
            print(f"{file} {name}: {ratio:.2f} like {other} {name}: {f'listed ({reason})' if reason else 'UNLISTED'}")
    for file, name, other, ratio in unlisted if not report else []:
        print(f"{file} {name} is {ratio:.2f} like {other}'s and unmarked: mark it '# Copied from {other}' (moving "
              f"what differs into a definition of its own) or give its reason in scripts/{ALLOWED}")
    stale_listed = sorted(set(listed) - {(twin[0], twin[1]) for twin in twins})
    for file, name in stale_listed:
        print(f"scripts/{ALLOWED} lists {file} {name}, which is no longer an unmarked near-twin: drop the line")
    return 1 if (drifted and not fix) or unlisted or stale_listed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fix", action="store_true", help="rewrite the copies that differ from their source")
    parser.add_argument("--report", action="store_true", help="list the unmarked near-twins and their similarity")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose files to check (default: this one)")
    args = parser.parse_args()
    try:
        return check(args.root, args.fix, args.report)
    except (CopyError, SyntaxError, tokenize.TokenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
