"""The documentation cannot drift from the code it describes.

- docs/configuration.md: its group table names every folder under conf/ with exactly the
  options (YAML files) that folder holds, and the schema node each fills; its key tables
  name every field of the schema dataclasses (`asr_grpo.config.schema`), nothing else,
  with the default the shipped config composes to.
- docs/rewards.md's example reward file loads through the project's own loader and gives
  the values it documents.
- README.md stays a front page (<= 200 lines); every relative link in README.md and
  docs/*.md points at a file that exists.
- No text in README, docs, bench, conf or examples speaks of the project's own
  development rounds.

Key-table format (docs/configuration.md): a table whose header's first cell is
`<Root> key`, Root one of the schema's top-level dataclasses (RunConfig, CompareConfig,
ForecastConfig), and whose rows start with the key's dotted path from that root in
backticks, then its default in backticks:

    | RunConfig key | default | what |
    | --- | --- | --- |
    | `trainer.steps` | `100` | RL steps |

Group-table format: a table whose header is `| group | options | schema | what |`; a row
names the group, its options and the schema node(s) it fills (`RunConfig.trainer`), or
none for a `# @package _global_` group.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
import typing
from pathlib import Path

import pytest

from asr_grpo.config import schema
from asr_grpo.config.store import CONF_DIR
from asr_grpo.rewards.loader import call_reward_function, load_reward_function

REPO = Path(__file__).resolve().parents[2]
CONF = Path(CONF_DIR)
DOCS = REPO / "docs"
CONFIG_DOC = DOCS / "configuration.md"
REWARD_EXAMPLE = REPO / "examples" / "rewards" / "char_accuracy.py"
# Which shipped config composes each root's defaults.
ROOT_CONFIG_FILES = {"RunConfig": "config", "CompareConfig": "compare", "ForecastConfig": "forecast",
                     "InitConfig": "init"}


# ---- the schema -------------------------------------------------------------------------------
def _hints(cls) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls, vars(schema))


def _dataclass_of(tp) -> type | None:
    return tp if dataclasses.is_dataclass(tp) and isinstance(tp, type) else None


def _nested_types(tp) -> list[type]:
    """Dataclasses a field's type mentions (itself, or inside list[...] / Optional[...])."""
    if (dc := _dataclass_of(tp)) is not None:
        return [dc]
    return [t for arg in typing.get_args(tp) for t in _nested_types(arg)]


def schema_roots() -> dict[str, type]:
    """The top-level schemas: dataclasses of the schema module no other one contains."""
    classes = {name: c for name, c in vars(schema).items()
               if dataclasses.is_dataclass(c) and isinstance(c, type) and c.__module__ == schema.__name__}
    inner = {t for c in classes.values() for f in dataclasses.fields(c) for t in _nested_types(_hints(c)[f.name])}
    return {name: c for name, c in classes.items() if c not in inner}


def resolve(root: type, path: str) -> tuple[type, str]:
    """(dataclass, field name) a dotted key names under `root`; AssertionError if none."""
    cls, parts = root, path.split(".")
    for i, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(cls)}
        assert part in names, f"`{path}`: {cls.__name__} has no field {part!r} (has {sorted(names)})"
        if i == len(parts) - 1:
            return cls, part
        nested = _dataclass_of(_hints(cls)[part])
        assert nested is not None, f"`{path}`: {cls.__name__}.{part} is a value, not a section"
        cls = nested
    raise AssertionError(f"empty key {path!r}")


def leaf_fields(cls: type) -> set[tuple[type, str]]:
    """Every (dataclass, field) below `cls` that holds a value (nested sections walked)."""
    out = set()
    for f in dataclasses.fields(cls):
        nested = _dataclass_of(_hints(cls)[f.name])
        out |= leaf_fields(nested) if nested is not None else {(cls, f.name)}
    return out


# ---- the composed defaults --------------------------------------------------------------------
def composed(config_name: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from asr_grpo.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name)
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)


def lookup(tree: dict, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def render(value) -> str:
    """How a default is written in the doc's default column (YAML-like)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(v)}" for k, v in value.items()) + "}"
    return str(value)


# ---- the doc's tables -------------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of every markdown table."""
    tables, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            header, rows, i = _cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def key_rows() -> list[tuple[str, str, str]]:
    """(root, dotted key, default cell) for every row of every key table."""
    out = []
    for header, rows in _tables(CONFIG_DOC.read_text()):
        m = re.fullmatch(r"(\w+) key", header[0])
        if not m:
            continue
        assert header[1] == "default", f"key table of {m.group(1)}: second column must be `default`"
        for row in rows:
            keys = _ticked(row[0])
            assert len(keys) == 1, f"key table of {m.group(1)}: a row must name one key in backticks: {row}"
            defaults = _ticked(row[1])
            assert len(defaults) == 1, f"`{keys[0]}`: the default must be one value in backticks: {row[1]!r}"
            out.append((m.group(1), keys[0], defaults[0]))
    return out


def group_rows() -> dict[str, tuple[list[str], list[str]]]:
    """group -> (options, schema nodes) from the group table."""
    for header, rows in _tables(CONFIG_DOC.read_text()):
        if [h.lower() for h in header[:3]] == ["group", "options", "schema"]:
            out = {}
            for row in rows:
                (group,) = _ticked(row[0])
                out[group] = (_ticked(row[1]), _ticked(row[2]))
            return out
    raise AssertionError(f"{CONFIG_DOC}: no `| group | options | schema | ... |` table")


# ---- configuration.md -------------------------------------------------------------------------
def test_every_config_group_is_documented_with_its_options():
    doc = group_rows()
    on_disk = {p.name: sorted(y.stem for y in p.glob("*.yaml")) for p in CONF.iterdir()
               if p.is_dir() and any(p.glob("*.yaml"))}
    assert set(doc) == set(on_disk), (f"groups only in the doc: {sorted(set(doc) - set(on_disk))}; "
                                      f"only under conf/: {sorted(set(on_disk) - set(doc))}")
    for group, (options, _) in doc.items():
        assert sorted(options) == on_disk[group], \
            f"group {group}: doc lists {sorted(options)}, conf/ has {on_disk[group]}"


def test_group_schema_nodes_exist_and_entry_configs_are_named():
    roots = schema_roots()
    for group, (_, nodes) in group_rows().items():
        for node in nodes:
            root, _, path = node.partition(".")
            assert root in roots, f"group {group}: {node}: {root} is not a top-level schema ({sorted(roots)})"
            cls, name = resolve(roots[root], path)
            assert _dataclass_of(_hints(cls)[name]) is not None, f"group {group}: {node} is a value, not a section"
    text = CONFIG_DOC.read_text()
    for top in sorted(CONF.glob("*.yaml")):
        assert f"conf/{top.name}" in text, f"conf/{top.name} (an entry-point config) is not named in {CONFIG_DOC.name}"


def test_documented_keys_exist_in_the_schema():
    roots = schema_roots()
    rows = key_rows()
    assert rows, f"{CONFIG_DOC}: no key tables"
    seen: dict[tuple[str, str], int] = {}
    for root, key, _ in rows:
        assert root in roots, f"key table of {root}: not a top-level schema ({sorted(roots)})"
        resolve(roots[root], key)
        seen[(root, key)] = seen.get((root, key), 0) + 1
    assert not [k for k, n in seen.items() if n > 1], f"keys documented twice: {[k for k, n in seen.items() if n > 1]}"


def test_every_schema_key_is_documented():
    """Every value-holding field reachable from a top-level schema appears in a key table
    (a dataclass used in several places, like OverlapConfig, needs documenting once)."""
    roots = schema_roots()
    documented = {resolve(roots[root], key) for root, key, _ in key_rows() if root in roots}
    required = set().union(*(leaf_fields(c) for c in roots.values()))
    missing = sorted(f"{cls.__name__}.{name}" for cls, name in required - documented)
    assert not missing, f"schema fields missing from {CONFIG_DOC.name}: {missing}"


@pytest.mark.parametrize("root", sorted(ROOT_CONFIG_FILES))
def test_documented_defaults_are_what_the_shipped_config_composes(root):
    tree = composed(ROOT_CONFIG_FILES[root])
    wrong = [f"`{key}`: doc says {default!r}, conf/{ROOT_CONFIG_FILES[root]}.yaml gives {render(lookup(tree, key))!r}"
             for r, key, default in key_rows() if r == root and render(lookup(tree, key)) != default]
    assert not wrong, "\n".join(wrong)


# ---- the reward example -----------------------------------------------------------------------
def test_reward_example_loads_through_the_loader_and_gives_its_documented_values():
    fn = load_reward_function(str(REWARD_EXAMPLE))
    labels = ["the cat sat", "the cat sat", "我爱北京天安门", "the cat sat"]
    responses = ["the cat sat", "language English<asr_text>the cat", "我爱北京", "the cat sat"]
    # As the RL loop calls it: the query is the response (the prompt is audio), plus the kwargs.
    result = call_reward_function(
        fn, queries=responses, prompts=[""] * 4, labels=labels, responses=responses,
        languages=["en", "en", "zh", "en"], keywords=[["cat"], [], ["北京"], []],
        finish_reasons=["stop", "stop", "stop", "length"], weights={"cer": 1.0},
        sample_ids=["a", "b", "c", "d"], timeout_s=10.0)
    assert result.total.tolist() == pytest.approx([1.0, 7 / 11, 4 / 7, 0.0], abs=1e-6)
    assert result.scores.tolist() == pytest.approx(result.total.tolist())
    assert result.components["char_accuracy"].tolist() == pytest.approx([1.0, 7 / 11, 4 / 7, 1.0], abs=1e-6)
    assert result.components["truncated"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert result.keep.all()
    assert "examples/rewards/char_accuracy.py" in (DOCS / "rewards.md").read_text()


# ---- README and links -------------------------------------------------------------------------
def test_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to docs/"


def _doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md")), REPO / "bench" / "results" / "README.md"]


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_existing_files(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)   # code blocks hold no links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue   # a URL or an anchor on the same page
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links to missing files: {broken}"


# ---- no development-round wording -------------------------------------------------------------
ROUND_WORDING = re.compile(
    r"\b[Ss]ession ?\d+|\b(?:last|this|previous|next|earlier|later) session\b|\bborrowed (?:GPU|machine)"
    r"|\blent (?:a |the )?(?:GPU|machine)|\ba lent\b|\bdevelopment round", re.IGNORECASE)


def _prose_files() -> list[Path]:
    out = [REPO / "README.md"]
    for folder, patterns in (("docs", ("*.md",)), ("bench", ("*.md", "*.py", "*.sh", "*.json")),
                             ("conf", ("*.yaml",)), ("examples", ("*.py", "*.md"))):
        for pattern in patterns:
            out += sorted((REPO / folder).rglob(pattern))
    return out


def test_no_text_speaks_of_development_rounds():
    hits = []
    for path in _prose_files():
        if m := ROUND_WORDING.search(str(path.relative_to(REPO))):
            hits.append(f"{path.relative_to(REPO)}: {m.group(0)!r} in the path")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if m := ROUND_WORDING.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)!r}")
    assert not hits, "development-round wording:\n" + "\n".join(hits)
