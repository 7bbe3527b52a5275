#!/usr/bin/env python3
"""Checks the tree's layering from the sources (docs/architecture.md, "Layers").

The build already refuses an upward #include in every file a layer compiles (each layer's
include path is a folder of links to the layers it may use, CMakeLists.txt). This check covers
the rest: headers nothing compiles yet, and one rule the compiler cannot see, that only the
engine defines the C API's functions. Usage: check_layers.py [ROOT]; exit 1 listing each
violation as FILE:LINE: what.
"""
import pathlib
import re
import sys

# Which top-level folders each folder's files may include ("ckptdb/ckptdb.h", the public header,
# is open to all: it defines the status codes and the C types).
ALLOWED = {
    "util": {"util"},
    "format": {"util", "format"},
    "io": {"util", "io"},
    "transport": {"util", "transport"},
    "redundancy": {"util", "redundancy"},
    "engine": {"util", "format", "io", "transport", "redundancy", "engine"},
    "harness": {"harness"},
    "tools": {"util", "format", "redundancy", "harness", "tools"},
    "bench": {"util", "format", "redundancy", "transport", "io", "harness", "bench"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]*"')
# The start of a C API function's definition in a .cc file: a return type and "ckptdb_NAME(" at
# the start of a line (a call is indented or follows "=" or "return"), not ending in ";".
C_API_DEFINITION = re.compile(r'^(?:extern\s+"C"\s+)?(?:const\s+)?[A-Za-z_]\w*[\s\*]+ckptdb_\w+\s*\((?!.*;\s*$)')


def check(root: pathlib.Path) -> list:
    problems = []
    for layer, allowed in ALLOWED.items():
        folder = root / layer
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu") or not path.is_file():
                continue
            rel = path.relative_to(root)
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) != "ckptdb" and m.group(1) not in allowed:
                    problems.append(f"{rel}:{n}: {layer}/ includes {m.group(1)}/ "
                                    f"(it may use {', '.join(sorted(allowed))})")
                if layer != "engine" and path.suffix != ".h" and C_API_DEFINITION.match(line):
                    problems.append(f"{rel}:{n}: defines a C API function outside engine/")
    return problems


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) in {root}")
        return 1
    print(f"check_layers: {root}: every include goes down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
