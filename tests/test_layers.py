"""The packages of vramlens form layers: a package imports only packages of lower layers
(DESIGN.md "Layout"). Every import counts, at module level or inside a function, including
``TYPE_CHECKING`` blocks, so a lazy import cannot hide a dependency running back up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "vramlens"

#: Lowest first; a package may import its own layer's files and any package in an earlier layer.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "_version _compat _lazy _dataclass_cache _records errors",
        "units dtypes categories _extras _files _untrusted",
        "allocator hardware _notes",
        "model",
        "workload",
        "resolve",
        "result",
        "estimator",
        "trace",
        "simulator",
        "snapshot",
        "forensics",
        "report",
        "planner",
        "rlhf",
        "experiments",
        "integrations",
        "web",
        "cli",
        "__init__ __main__",
    )
)
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


def _package(module: str) -> str:
    """``vramlens.estimator.training`` -> ``estimator``; ``vramlens`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if target == "vramlens":
        return [f"vramlens.{alias.name}" for alias in node.names]
    return [target]


def package_imports(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """``(importer package, imported package) -> files`` over every import of every module."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src.parent).with_suffix("")
        is_package = path.name == "__init__.py"
        module = ".".join(relative.parts[:-1] if is_package else relative.parts)
        importer = "__init__" if module == "vramlens" else _package(module)
        if path.parent == src and not is_package:
            importer = path.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, module, is_package):
                if target.split(".")[0] != "vramlens" or target == "vramlens":
                    continue
                imported = _package(target)
                if imported != importer:
                    edges.setdefault((importer, imported), []).append(str(path.relative_to(src)))
    return edges


def violations(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """Imports that run sideways or back up the layers, or name a package with no layer."""
    found = []
    for (importer, imported), files in sorted(edges.items()):
        if importer not in RANK or imported not in RANK:
            found.append(f"{importer} -> {imported}: package not in LAYERS ({files[0]})")
        elif RANK[imported] >= RANK[importer]:
            found.append(f"{importer} -> {imported} runs up or sideways ({', '.join(sorted(set(files)))})")
    return found


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in SRC.glob("*.py")}
    assert sorted((packages | modules) - set(RANK)) == []


def test_imports_run_down_the_layers() -> None:
    assert violations(package_imports()) == []


@pytest.mark.parametrize(
    ("importer", "line"),
    [
        ("estimator/training.py", "from vramlens.planner import plan"),
        ("model/spec.py", "from vramlens.estimator import estimate"),
        ("result/report.py", "    from vramlens.report.text import render_text"),
        ("allocator/pattern.py", "import vramlens.workload"),
        ("resolve/context.py", "from . import kbit\nfrom ..estimator import qlora"),
    ],
)
def test_an_import_back_up_is_caught(tmp_path: Path, importer: str, line: str) -> None:
    """The check itself: a copy of the tree with one import added upward fails it."""
    copy = tmp_path / "vramlens"
    for path in SRC.rglob("*.py"):
        target = copy / path.relative_to(SRC)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    added = copy / importer
    added.write_text(added.read_text(encoding="utf-8") + "\n\ndef _added() -> None:\n" + _indent(line) + "\n")
    assert violations(package_imports(copy)) != []
    assert violations(package_imports(SRC)) == []


def _indent(line: str) -> str:
    return "\n".join("    " + part.strip() for part in line.split("\n"))
