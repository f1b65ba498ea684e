"""The construct contract, checked over the package's source as awslint checks aws-cdk's: how a
construct takes its cluster, the one cast, documented defaults, string enums as ``Literal``, errors
that name the construct, and a public name for every construct. Each rule is shown failing on a
broken sample."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest
from support import ROOT

import eks_pd_serving

PACKAGE = ROOT / "constructs" / "eks_pd_serving"
# Free-form strings a construct takes (an open set of values, so no Literal): with the reason.
FREE_FORM = {
    ("GcsStore", "node_type"): "any ElastiCache node type the region offers",
}


def construct_classes(root: Path) -> list[tuple[Path, ast.ClassDef]]:
    """Every class that subclasses ``Construct`` directly, outside ``_private``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_private" in path.relative_to(root).parts:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(ast.unparse(base) == "Construct" for base in node.bases):
                found.append((path, node))
    return found


def keyword_props(cls: ast.ClassDef) -> list[tuple[ast.arg, ast.expr | None]]:
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return [] if init is None else list(zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True))


def param_doc(cls: ast.ClassDef, name: str) -> str | None:
    doc = ast.get_docstring(cls) or ""
    parts = re.split(r":param (\w+):", doc)
    docs = dict(zip(parts[1::2], parts[2::2], strict=True))
    return " ".join(docs[name].split()) if name in docs else None


def dataclass_field_docs(tree: ast.Module, source: str) -> list[tuple[str, str, ast.expr, str | None]]:
    """(class, field, default, its ``#:`` comment) of every defaulted field of a ``*Props`` dataclass
    (in a construct's module: the charts' props are built whole by the mapping)."""
    lines = source.splitlines()
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Props"):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and item.value is not None and isinstance(item.target, ast.Name):
                    above = lines[item.lineno - 2].strip()
                    comment = above[2:].strip() if above.startswith("#:") else None
                    found.append((node.name, item.target.id, item.value, comment))
    return found


def _states_default(doc: str | None, default: ast.expr) -> bool:
    """A ``Default:`` that names the default as the code writes it (a None default says what it
    means in words)."""
    if doc is None or "Default:" not in doc:
        return False
    stated = doc.split("Default:", 1)[1].strip()
    if isinstance(default, ast.Constant) and default.value is None:
        return bool(stated)
    written = ast.unparse(default)
    if isinstance(default, ast.Constant) and isinstance(default.value, str):
        return stated.startswith((written, default.value, f'"{default.value}"'))
    return stated.startswith(written)


def undocumented_defaults(root: Path) -> list[str]:
    """awslint's props-default-doc: each optional prop documented once, with its default."""
    offenders = []
    for _path, cls in construct_classes(root):
        for arg, default in keyword_props(cls):
            doc = param_doc(cls, arg.arg)
            if doc is None:
                offenders.append(f"{cls.name}.{arg.arg}: no :param")
            elif default is not None and not _states_default(doc, default):
                offenders.append(f"{cls.name}.{arg.arg}: Default: must state {ast.unparse(default)}")
    for path in sorted({path for path, _cls in construct_classes(root)}):
        source = path.read_text()
        for cls_name, field, default, comment in dataclass_field_docs(ast.parse(source), source):
            if not _states_default(comment, default):
                offenders.append(f"{cls_name}.{field}: #: Default: must state {ast.unparse(default)}")
    return offenders


def concrete_clusters(root: Path) -> list[str]:
    """awslint's ref-via-interface: a construct takes ``eks.ICluster``; the concrete class only
    where its :param says why ("ref-via-interface")."""
    offenders = []
    for _path, cls in construct_classes(root):
        for arg, _default in keyword_props(cls):
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            if annotation == "eks.Cluster" and "ref-via-interface" not in (param_doc(cls, arg.arg) or ""):
                offenders.append(f"{cls.name}.{arg.arg}")
    return offenders


def casts(root: Path) -> list[str]:
    """Every ``cast(...)`` in the package, as file:line."""
    return sorted(
        f"{path.relative_to(root)}:{node.lineno}"
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("cast", "typing.cast")
    )


def open_string_enums(root: Path) -> list[str]:
    """A ``str`` prop with a literal default is one of a few values: a ``Literal``, unless free-form."""
    offenders = []
    for _path, cls in construct_classes(root):
        for arg, default in keyword_props(cls):
            is_str = arg.annotation is not None and ast.unparse(arg.annotation) == "str"
            literal_default = isinstance(default, ast.Constant) and isinstance(default.value, str)
            if is_str and literal_default and (cls.name, arg.arg) not in FREE_FORM:
                offenders.append(f"{cls.name}.{arg.arg}")
    return offenders


def unscoped_errors(root: Path) -> list[str]:
    """A module that defines a construct raises ``ConstructError`` (its path first), not a bare
    ``ConfigError``."""
    offenders = []
    for path, _cls in construct_classes(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None and "ConfigError(" in ast.unparse(node.exc):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(offenders))


def unexported(root: Path, exports: set[str]) -> list[str]:
    return sorted(cls.name for _path, cls in construct_classes(root) if cls.name not in exports)


# --- the package holds the contract ------------------------------------------------------------
def test_every_construct_takes_the_cluster_interface_but_the_documented_exception() -> None:
    assert concrete_clusters(PACKAGE) == []


def test_one_cast_in_the_package_the_documented_cluster_handle() -> None:
    (only,) = casts(PACKAGE)
    assert only.startswith("cluster.py:")


def test_every_optional_prop_documents_its_default_as_the_code_writes_it() -> None:
    assert undocumented_defaults(PACKAGE) == []


def test_string_enums_are_literals() -> None:
    assert open_string_enums(PACKAGE) == []


def test_construct_errors_name_the_construct() -> None:
    assert unscoped_errors(PACKAGE) == []


def test_every_public_construct_is_exported() -> None:
    assert unexported(PACKAGE, set(eks_pd_serving.__all__)) == []


# --- each rule fails on a broken sample --------------------------------------------------------
BROKEN = '''
from constructs import Construct
from typing import cast

class Widget(Construct):
    """:param cluster: the cluster.
    :param size: nodes. Default: 3.
    :param mode: fast or slow.
    """

    def __init__(self, scope, id, *, cluster: eks.Cluster, size: int = 2, mode: str = "fast", colour: int = 1):
        handle = cast(eks.ICluster, cluster)
        raise ConfigError("size=2 is wrong")


@dataclass(frozen=True)
class WidgetProps:
    #: Nodes. Default: 1.35.
    version: str = versions.DEFAULT
'''


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    (tmp_path / "widget.py").write_text(textwrap.dedent(BROKEN))
    return tmp_path


def test_the_contract_rules_see_each_breach(broken: Path) -> None:
    assert concrete_clusters(broken) == ["Widget.cluster"]
    assert casts(broken) == ["widget.py:12"]
    assert undocumented_defaults(broken) == [
        "Widget.size: Default: must state 2",
        "Widget.mode: Default: must state 'fast'",
        "Widget.colour: no :param",
        "WidgetProps.version: #: Default: must state versions.DEFAULT",
    ]
    assert open_string_enums(broken) == ["Widget.mode"]
    assert unscoped_errors(broken) == ["widget.py:13"]
    assert unexported(broken, {"PdServing"}) == ["Widget"]


def test_the_documented_exception_passes(broken: Path) -> None:
    fixed = (
        (broken / "widget.py")
        .read_text()
        .replace(
            ":param cluster: the cluster.", ":param cluster: the concrete Cluster (ref-via-interface: it adds nodes)."
        )
    )
    (broken / "widget.py").write_text(fixed)
    assert concrete_clusters(broken) == []
