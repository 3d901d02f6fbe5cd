"""Checks that FlexNPU's includes and imports run one way, down the layers of docs/architecture.md.

C++ (pjrt_flexnpu/, xla_passes/): c_api -> runtime -> {placement, backend, hardware, xla_passes}
-> base, with the daemon server above backend. Python (python/flexnpu/): cli above serving and
sim; sim may use serving's public names only; serving never imports sim or cli; the core modules
(analysis, placement, hardware, ...) import neither.

Usage: python tools/check_layers.py [REPO]   (exit 1 and one line per arrow that runs up)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# Each C++ layer and the layers it may include (its own always allowed).
CPP_ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "xla_passes": {"base"},
    "placement": {"base"},
    "hardware": {"base"},
    "backend": {"base", "hardware", "xla_passes"},
    "runtime": {"base", "backend", "placement", "hardware", "xla_passes"},
    "c_api": {"base", "backend", "placement", "hardware", "xla_passes", "runtime"},
    "daemon": {"base", "backend", "placement", "hardware", "xla_passes", "runtime"},
}

# Python: a top-level part of the package and the parts it may import.
PY_CORE = {
    "_paths",
    "_native_loader",
    "analysis",
    "placement",
    "hardware",
    "host_callbacks",
    "lowering",
    "stats",
    "metrics",
    "compilation_cache",
    "daemon",
    "jax_plugin",
    "phase",
    "_daemon_metrics",
    "_daemon_wire",
    "daemon_wire",
}
PY_ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "serving": {"core", "serving"},
    "sim": {"core", "serving", "sim"},
    "cli": {"core", "serving", "sim", "cli"},
    "__main__": {"core", "serving", "sim", "cli"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def cpp_layer(path: str) -> str | None:
    parts = path.split("/")
    if parts[0] == "xla_passes" and (len(parts) < 2 or parts[1] not in ("tests", "fuzz")):
        return "xla_passes"
    if parts[0] == "pjrt_flexnpu" and len(parts) > 2:
        return parts[1]
    return None


def check_cpp(repo: Path) -> list[str]:
    problems = []
    for path in sorted([*repo.glob("pjrt_flexnpu/**/*"), *repo.glob("xla_passes/**/*")]):
        if path.suffix not in (".h", ".cc"):
            continue
        rel = path.relative_to(repo).as_posix()
        layer = cpp_layer(rel)
        if layer is None:
            continue
        if layer not in CPP_ALLOWED:
            problems.append(f"{rel}: folder {layer!r} has no layer in tools/check_layers.py")
            continue
        for included in INCLUDE.findall(path.read_text()):
            target = cpp_layer(included)
            if target is None or target == layer:
                continue
            if target not in CPP_ALLOWED[layer]:
                problems.append(f"{rel}: {layer} includes {included} ({target} is above it)")
    return problems


def py_part(module: str) -> str:
    """The layer of `flexnpu.X...`."""
    top = module.split(".")[1] if "." in module else ""
    if top in ("serving", "sim", "cli", "__main__"):
        return top
    return "core"


def imported_modules(tree: ast.AST, package: str) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.append((base, [alias.name for alias in node.names]))
    return found


def check_python(repo: Path) -> list[str]:
    problems = []
    root = repo / "python"
    for path in sorted((root / "flexnpu").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        part = py_part(module)
        for name, names in imported_modules(ast.parse(path.read_text()), package):
            if not name.startswith("flexnpu"):
                continue
            target = py_part(name) if "." in name else "core"
            rel = path.relative_to(repo).as_posix()
            if target != part and target not in PY_ALLOWED[part]:
                problems.append(f"{rel}: {part} imports {name} ({target} is above it)")
            # A module's private names stay in it (package-private modules such as
            # flexnpu._paths are fine; their names are public to the package).
            folder = root.joinpath(*name.split("."))
            private = [
                n
                for n in names
                if n.startswith("_")
                and not n.startswith("__")
                and not (folder / f"{n}.py").exists()
                and not (folder / n).is_dir()
                and n != "_native"  # the nanobind extension, built, not in the tree
            ]
            if private:
                problems.append(f"{rel}: imports private {', '.join(private)} of {name}")
            # Across parts, only public modules.
            if target != part and target != "core":
                if any(p.startswith("_") for p in name.split(".")[2:]):
                    problems.append(f"{rel}: imports private module {name}")
    return problems


def main() -> int:
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    problems = check_cpp(repo) + check_python(repo)
    for line in problems:
        print(line)
    print(f"check_layers: {len(problems)} arrow(s) running up")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
