"""The settings reference is generated from the model and held to it; each default is written once."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from eks_pd_serving.config.settings import SECTIONS, Settings
from eks_pd_serving.fault_tolerance import runbook
from eks_pd_serving.k8s import serve_config
from eks_pd_serving.phase import Phase
from tools import layout_tree, settings_reference


def test_the_committed_settings_reference_is_what_the_model_generates() -> None:
    assert settings_reference.TARGET.read_text() == settings_reference.render()


def test_the_check_fails_on_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text(settings_reference.render().replace("`ray-llm-multinode`", "`ray-llm`"))
    monkeypatch.setattr(settings_reference, "TARGET", stale)
    assert settings_reference.main(["--check"]) == 1
    stale.write_text(settings_reference.render())
    assert settings_reference.main(["--check"]) == 0


def misplaced_settings(sections: dict[str, tuple[str, ...]], fields: set[str]) -> list[str]:
    """Settings in no section or in two, names no setting has, and sections above 15 settings."""
    listed = [name for names in sections.values() for name in names]
    return sorted(
        [f"{name}: in no section" for name in fields - set(listed)]
        + [f"{name}: in {listed.count(name)} sections" for name in set(listed) if listed.count(name) > 1]
        + [f"{name}: no such setting" for name in set(listed) - fields]
        + [f"{section}: {len(names)} settings" for section, names in sections.items() if len(names) > 15]
    )


def test_every_setting_is_in_one_section_of_at_most_fifteen() -> None:
    assert misplaced_settings(SECTIONS, set(Settings.model_fields)) == []
    assert list(settings_reference.sections()) != sorted(Settings.model_fields)  # the sections' order, not a-z


def test_the_section_check_sees_each_breach() -> None:
    fields = {"a", "b", "c"}
    assert misplaced_settings({"One": ("a", "b"), "Two": ("b", "x")}, fields) == [
        "b: in 2 sections", "c: in no section", "x: no such setting"
    ]  # fmt: skip
    assert misplaced_settings({"Big": tuple(f"s{i}" for i in range(16))}, {f"s{i}" for i in range(16)}) == [
        "Big: 16 settings"
    ]


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_each_default_is_written_once(name: str) -> None:
    field = Settings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    # The value documents itself; a description never repeats it (the copies drifted before).
    assert "Default:" not in (field.description or "")
    if field.default is None:
        assert extra.get("default_means"), f"{name}: say what an unset value does (means=...)"
    else:
        assert "default_means" not in extra


# --- the front door and its links ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in page.read_text().splitlines()
        if line.startswith("#")
    }


def broken_links(root: Path) -> list[str]:
    """Every relative Markdown link (outside code blocks) whose file or heading does not exist."""
    broken = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    assert broken_links(ROOT) == []


def test_the_link_check_finds_a_broken_file_and_a_broken_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Real heading\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#real-heading) [gone](docs/b.md) [typo](docs/a.md#real-headin)\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#real-headin (no such heading)",
    ]


PACKAGE = ROOT / "constructs" / "eks_pd_serving"
_FILE = re.compile(r"[\w.\-]+(/[\w.\-]+)*/?")
_SUFFIXES = (".py", ".md", ".json", ".yaml", ".yml", ".txt", ".sh", ".toml")


def _ours(root: Path, package: Path) -> set[str]:
    """The first path segments that are this project's: the repository's and the package's entries
    (an upstream path such as ``vllm/config/kv_transfer.py`` starts elsewhere and is not checked)."""
    return {p.name for p in (*root.iterdir(), *package.iterdir())} - {"cdk.out", "node_modules"}


def broken_code_refs(root: Path, package: Path) -> list[str]:
    """Backticked code paths (``k8s/ray_service.py``, ``docs/guides/``) and module names
    (``eks_pd_serving.assembly``, ``mapping.endpoint_plan``) in the README and docs (outside code
    blocks) that name nothing: a file that moved, a function that was renamed."""
    ours, modules = _ours(root, package), {p.stem for p in package.iterdir() if p.suffix == ".py" or p.is_dir()}
    broken = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for token in re.findall(r"`([^`\s]+)`", text):
            token = token.rstrip(".,:;")
            if _FILE.fullmatch(token) and ("/" in token or token.endswith(_SUFFIXES)):
                if (token.split("/")[0] in ours and "/" in token) or (package / token).exists():
                    places = (root / token, package / token, page.parent / token)
                    if not any(place.exists() for place in places):
                        broken.append(f"{page.relative_to(root)}: {token} (no such file)")
                continue
            if match := re.fullmatch(r"(eks_pd_serving\.)?([a-z_]\w*(?:\.\w+)*)(?:\(\))?", token):
                parts = match.group(2).split(".")
                named = bool(match.group(1)) or (parts[0] in modules and len(parts) > 1)
                if named and not (parts[0] in modules and _resolves(package, parts)):
                    broken.append(f"{page.relative_to(root)}: {token} (no such module or name)")
    return broken


def _resolves(package: Path, parts: list[str]) -> bool:
    """Whether ``package.parts[0].parts[1]...`` is a module or a name defined at a module's top level
    (read from the source: nothing is imported)."""
    import ast

    here = package
    for index, part in enumerate(parts):
        if (here / part).is_dir():
            here = here / part
            continue
        module = here / f"{part}.py" if (here / f"{part}.py").exists() else here / "__init__.py"
        if module == here / "__init__.py" and index == 0:
            return False
        if not module.exists():
            return False
        rest = parts[index + 1 :] if module.stem == part else parts[index:]
        if not rest:
            return True
        tree = ast.parse(module.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
                names |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        return rest[0] in names
    return True


def test_every_code_path_and_module_name_in_the_docs_exists() -> None:
    assert broken_code_refs(ROOT, PACKAGE) == []


def test_the_code_reference_check_sees_a_moved_file_and_a_renamed_name(tmp_path: Path) -> None:
    package = tmp_path / "constructs" / "eks_pd_serving"
    (package / "k8s").mkdir(parents=True)
    (package / "k8s" / "__init__.py").write_text("")
    (package / "k8s" / "ray_service.py").write_text("def chart():\n    pass\n")
    (package / "mapping.py").write_text("def plan():\n    pass\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "`k8s/ray_service.py` `k8s/gone.py` `docs/` `docs/missing.md` `vllm/v1/engine.py` "
        "`mapping.plan` `mapping.old_plan` `eks_pd_serving.k8s.ray_service.chart` `eks_pd_serving.nope` "
        "`config.json` `mapping.py`\n"
    )
    assert broken_code_refs(tmp_path, package) == [
        "README.md: k8s/gone.py (no such file)",
        "README.md: docs/missing.md (no such file)",
        "README.md: mapping.old_plan (no such module or name)",
        "README.md: eks_pd_serving.nope (no such module or name)",
    ]


def test_the_layout_pages_package_table_is_what_the_docstrings_say() -> None:
    assert layout_tree.main(["--check"]) == 0


def test_the_layout_check_sees_a_new_module_and_one_without_a_docstring(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text('"""A folder. More."""\n')
    (package / "one.py").write_text('"""One module: what it holds. Details."""\n')
    page = f"# Layout\n\n{layout_tree.BEGIN}\n{layout_tree.END}\n"
    rendered = layout_tree.render(page, package)
    assert "| `one.py` | One module: what it holds. |" in rendered and "| `sub/` | A folder. |" in rendered
    (package / "two.py").write_text('"""Two."""\n')
    assert layout_tree.render(rendered, package) != rendered  # a new module changes the table
    (package / "three.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"three\.py has no docstring"):
        layout_tree.render(page, package)


def undocumented_members(package: Path) -> list[str]:
    """Each folder below ``package`` whose ``__init__`` docstring does not name one of its modules or
    subfolders (the root's are the layout page's generated table)."""
    found = []
    for init in sorted(package.rglob("__init__.py")):
        folder = init.parent
        if folder == package or "__pycache__" in folder.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        members = [p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
        members += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
        found += [f"{folder.relative_to(package)}/{m}" for m in sorted(members) if not re.search(rf"\b{m}\b", doc)]
    return found


def test_every_folders_docstring_names_what_the_folder_holds() -> None:
    assert undocumented_members(ROOT / "constructs" / "eks_pd_serving") == []
    assert undocumented_members(ROOT / "rehearsal") == []


def test_the_folder_check_sees_an_unnamed_module_and_subfolder(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "room" / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The root: exempt."""\n')
    (package / "room" / "__init__.py").write_text('"""Holds ``named``."""\n')
    (package / "room" / "named.py").write_text("")
    (package / "room" / "forgotten.py").write_text("")
    (package / "room" / "inner" / "__init__.py").write_text('"""Inner."""\n')
    assert undocumented_members(package) == ["room/forgotten", "room/inner"]


def test_the_cli_pages_command_table_is_the_clis_and_each_command_has_its_section() -> None:
    from eks_pd_serving.cli import COMMANDS
    from tools import cli_reference

    assert cli_reference.main(["--check"]) == 0
    headings = re.findall(r"^## `([a-z0-9-]+)`", cli_reference.PAGE.read_text(), re.MULTILINE)
    assert sorted(headings) == sorted(COMMANDS)


@pytest.mark.parametrize(
    ("tool", "written"), [("cli_reference", "[`verify`](#verify)"), ("fault_reference", "| `gcs` |")]
)
def test_a_generated_tables_check_sees_a_stale_table_and_a_page_without_markers(
    tool: str, written: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(f"tools.{tool}")
    section = module.SECTION
    stale = tmp_path / section.page.name
    stale.write_text(f"# A page\n\n{section.begin}\n| an old row |\n{section.end}\n")
    monkeypatch.setattr(module, "SECTION", dataclasses.replace(section, page=stale))
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0 and written in stale.read_text()
    assert module.main(["--check"]) == 0
    stale.write_text("# A page without the markers\n")
    with pytest.raises(ValueError, match="lacks its generated section's markers"):
        module.main([])


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    sections = [line for line in readme.splitlines() if line.startswith("## ")]
    assert sections == [
        "## Two commands",
        "## A first deploy",
        "## As a construct in your own app",
        "## Known problems",
        "## Documentation",
        "## What is proven offline, and what only on paper",
        "## Libraries and what they carry",
    ]


def test_the_failures_page_shows_the_runbooks_command_as_the_package_has_it() -> None:
    page = (ROOT / "docs" / "features" / "failures.md").read_text()
    shown = "\n".join(line.removeprefix("  ") for line in page.splitlines())
    assert runbook.replace_decode_command() in shown
    assert runbook.replace_decode_command("other") not in shown  # the check can fail
    # Decode's replicas in either layout: its own application, or Ray's one.
    for app in ("pd-decode", serve_config.APP_NAME):
        name = f"{runbook.REPLICA_PREFIX}{app}#{serve_config.deployment_name(Phase.DECODE, 'qwen3.5-9b')}#abc"
        assert name.startswith(runbook.REPLICA_PREFIX) and runbook.DECODE_DEPLOYMENT in name
    prefill = f"SERVE_REPLICA::pd-prefill#{serve_config.deployment_name(Phase.PREFILL, 'qwen3.5-9b')}#abc"
    assert runbook.DECODE_DEPLOYMENT not in prefill


def undocumented_rules(page: str) -> list[str]:
    """Lifecycle rules the reference page's table does not list (a row per rule, its name first)."""
    from eks_pd_serving.lifecycle import rules

    names = [*rules.TEMPLATE_RULES, *rules.UPDATE_RULES, "named_log_groups_preflighted"]
    return [name for name in names if f"| `{name}`" not in page]


def test_the_lifecycle_page_lists_every_rule() -> None:
    page = (ROOT / "docs" / "reference" / "lifecycle.md").read_text()
    assert undocumented_rules(page) == []
    assert undocumented_rules(page.replace("| `serve_port_admits_nlb_subnets`", "| serve port")) == [
        "serve_port_admits_nlb_subnets"
    ]


def picture_drift(readme: str) -> list[str]:
    """The README's architecture picture (its first code block) against the code: each pinned fact
    it shows, as the code has it now; the facts it no longer shows."""
    from eks_pd_serving import versions
    from eks_pd_serving._private.launch_template import GPU_IMDS_HOP_LIMIT, SYSTEM_IMDS_HOP_LIMIT
    from eks_pd_serving.config import DeploymentConfig
    from eks_pd_serving.network import VPC_CIDR

    picture = readme.split("```\n", 2)[1]
    lines = picture.splitlines()
    system = next(line for line in lines if "system node group" in line)
    gpu_template = next(line for line in lines if "launch template:" in line)
    c = DeploymentConfig.create()
    facts = {
        f"VPC {VPC_CIDR}": picture,
        f"EKS {c.kubernetes_version}": picture,
        f"{c.system_instance_type} x{c.system_node_count}": system,
        f"gp3 {c.system_root_volume_gib} GiB root": system,
        f"IMDSv2 (hop {SYSTEM_IMDS_HOP_LIMIT})": system,
        f"{c.gpu_instance_type} x{c.gpu_node_count}": picture,
        f"IMDSv2 (hop {GPU_IMDS_HOP_LIMIT})": gpu_template,
        f"gp3 {c.gpu_root_volume_gib} GiB root": picture,
        f"KubeRay operator {versions.KUBERAY_VERSION}": picture,
        f"NVIDIA device plugin {versions.NVIDIA_DEVICE_PLUGIN_CHART.version}": picture,
        f"RayService {c.ray_service_name} in namespace {c.namespace}": picture,
        f"add-on {c.cloudwatch_addon_version}": picture,
    }
    return [fact for fact, where in facts.items() if fact not in where]


def test_the_readmes_picture_shows_what_the_code_deploys() -> None:
    readme = (ROOT / "README.md").read_text()
    assert picture_drift(readme) == []
    # The drift this test was written after: the GPU nodes' hop limit went to 1, the picture said 2.
    stale = readme.replace("IMDSv2 (hop 1)", "IMDSv2 (hop 2)").replace(
        "KubeRay operator 1.7.0", "KubeRay operator 1.4.0"
    )
    assert picture_drift(stale) == ["IMDSv2 (hop 1)", "KubeRay operator 1.7.0"]


def test_the_cli_pages_sizing_sample_is_what_the_command_prints() -> None:
    """The sample on docs/reference/cli.md, line for line, in `python -m eks_pd_serving sizing`'s
    output for the default settings (it drifted once: 11.73 sequences before max_num_seqs was pinned)."""
    import subprocess
    import sys

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    sample = page.split("$ .venv/bin/python -m eks_pd_serving sizing\n", 1)[1].split("```", 1)[0]
    shown = [line for line in sample.splitlines() if line and not line.startswith("decode: ...")]
    printed = subprocess.run(
        [sys.executable, "-m", "eks_pd_serving", "sizing"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(shown) >= 5 and [line for line in shown if line not in printed] == []
    assert "  129 blocks: capacity 48034 tokens; concurrency 11.73 sequences of 4096 tokens" not in printed  # the old
