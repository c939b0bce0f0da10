"""The import graph follows the layers of docs/architecture.md: a module imports only from
its own layer or the ones below, lazy imports inside functions included."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "asr_grpo"

# Lowest first; names on one line share a layer.
LAYERS = [
    {"config", "algorithms"},
    {"data"},
    {"models"},
    {"tracking", "rewards"},
    {"rollout"},
    {"distributed"},
    {"experience", "evaluation", "serving"},
    {"overlap"},
    {"workers"},
    {"forecast"},
    {"recipes"},
    {"run", "sft", "compare", "sweep"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def unit_of(path: Path) -> str:
    """The layer-table name of a module file: its top folder, or its own name at the top."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> set[tuple[str, int]]:
    """(unit, line) of every `asr_grpo.<unit>` import in the file, wherever it stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "asr_grpo" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_package_and_top_module_has_a_layer():
    units = {unit_of(p) for p in modules()} - {"__main__"}
    missing = sorted(units - set(LEVEL))
    assert not missing, f"place these in LAYERS (and in docs/architecture.md): {missing}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers(path):
    here = unit_of(path)
    if here not in LEVEL:
        pytest.skip("no layer (reported by the test above)")
    upward = sorted(f"line {line}: asr_grpo.{unit} ({unit} sits above {here})"
                    for unit, line in imported_units(path)
                    if unit in LEVEL and LEVEL[unit] > LEVEL[here])
    assert not upward, "\n".join(upward)


def test_the_checker_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    """The rule itself can fail: a lazy import of the recipes from the data layer is caught."""
    pkg = tmp_path / "asr_grpo"
    (pkg / "data").mkdir(parents=True)
    bad = pkg / "data" / "bad.py"
    bad.write_text("def f():\n    from asr_grpo.recipes.rl import RLRecipe\n    return RLRecipe\n")
    monkeypatch.setitem(unit_of.__globals__, "PACKAGE", pkg)
    with pytest.raises(AssertionError, match="recipes sits above data"):
        test_imports_go_down_the_layers(bad)
