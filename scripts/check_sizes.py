#!/usr/bin/env python3
"""Lists the engine's and transport's files over 900 lines and functions over 120 lines.

Issue 22's bounds: no .cc or .h under engine/ or transport/ over kMaxFileLines (wc -l), no
function over kMaxFunctionLines. The tree does not meet them yet, so the check is a ratchet:
scripts/size_baseline.txt names each offender as it stood when the check came in, with its
size. It fails when an offender is not in the baseline or has grown past its size there, and
when a baseline entry is no longer an offender (take it out: the ratchet only tightens).
Every offender is listed on each run.

A function is found by its shape in this tree's style (clang-format, namespaces not indented):
a line at column 0 that is not a comment, preprocessor line, namespace, class, struct, enum or
extern block, with "(" in it, whose opening "{" is at the end of it or of a following line of
the same signature, ending at the first "}" at column 0. Lambdas and local classes count
toward the function they are in. Usage: check_sizes.py [ROOT]
"""
import pathlib
import re
import sys

kMaxFileLines = 900
kMaxFunctionLines = 120
FOLDERS = ("engine", "transport")
NOT_A_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|template\s*<[^>]*>\s*(class|struct)|using|typedef|#|//|/\*|\})")


def functions(lines):
    """Yields (name, first line number, length in lines) of each function defined at column 0."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0].isspace() or NOT_A_FUNCTION.match(line) or "(" not in line:
            i += 1
            continue
        if "{" in line and line.rstrip().endswith("}"):  # "f() { ... }" on one line
            i += 1
            continue
        # The signature runs until a line ending in "{" (a definition) or ";" (a declaration).
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";", "}")) and j - i < 12:
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith("{"):  # a declaration, "... {}"
            i = j + 1
            continue
        end = j + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        m = re.search(r"([\w:~<>=!+\-*/\[\]]+)\s*\(", line)
        name = m.group(1) if m else line.strip()[:40]
        yield name, i + 1, end - i + 1
        i = end + 1


def offenders(root: pathlib.Path):
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).glob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            rel = str(path.relative_to(root))
            lines = path.read_text(errors="replace").splitlines()
            if len(lines) > kMaxFileLines:
                found[f"file {rel}"] = len(lines)
            for name, first, length in functions(lines):
                if length > kMaxFunctionLines:
                    found[f"function {rel}:{name}"] = length
    return found


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent)
    baseline = {}
    base_file = root / "scripts" / "size_baseline.txt"
    if base_file.exists():
        for line in base_file.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, size = line.rsplit(" ", 1)
                baseline[key] = int(size)
    found = offenders(root)
    failures = []
    for key, size in sorted(found.items()):
        limit = baseline.get(key)
        mark = "" if limit is not None and size <= limit else "  <- NEW OR GROWN"
        print(f"{key} {size} (baseline {limit if limit is not None else '-'}){mark}")
        if mark:
            failures.append(key)
    for key in sorted(set(baseline) - set(found)):
        print(f"{key}: within the bounds now; take it out of scripts/size_baseline.txt")
        failures.append(key)
    folders = " and ".join(f + "/" for f in FOLDERS)
    print(f"check_sizes: {len(found)} over {kMaxFileLines} lines a file or {kMaxFunctionLines} "
          f"a function in {folders}; {len(failures)} failing the ratchet")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
