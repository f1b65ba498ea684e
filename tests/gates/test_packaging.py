"""The `constructs/` folder must not shadow the `constructs` library, and versions agree."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import ROOT

from eks_pd_serving import versions


def test_import_constructs_is_the_library_even_from_the_repository_root() -> None:
    # The CDK CLI runs app.py with the repository root first on sys.path.
    code = "import constructs, sys; print(constructs.__file__); print(hasattr(constructs, 'Construct'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    path, has_construct = out.stdout.splitlines()
    assert "site-packages" in path and not path.startswith(str(ROOT / "constructs"))
    assert has_construct == "True"


def test_the_constructs_folder_is_not_a_package() -> None:
    assert not (ROOT / "constructs" / "__init__.py").exists(), (
        "constructs/__init__.py would make the folder shadow the constructs library"
    )


@pytest.mark.parametrize("release", versions.KUBERNETES_RELEASES.values(), ids=lambda r: r.version)
def test_every_supported_kubernetes_version_has_its_kubectl_layer(
    release: versions.KubernetesRelease,
) -> None:
    module = importlib.import_module(release.kubectl_layer_module)
    assert hasattr(module, release.kubectl_layer_class)
    requirements = (ROOT / "requirements.txt").read_text()
    assert release.kubectl_layer_package in requirements


def test_default_kubernetes_version_is_supported() -> None:
    assert versions.DEFAULT_KUBERNETES_VERSION in versions.KUBERNETES_RELEASES


def test_ray_requirements_pin_the_images_ray_version() -> None:
    assert f"ray[serve]=={versions.RAY_VERSION}" in (ROOT / "requirements-ray.txt").read_text()


def test_aws_cdk_lib_pin_matches_the_versions_module() -> None:
    assert f"aws-cdk-lib=={versions.AWS_CDK_LIB_VERSION}" in (ROOT / "requirements.txt").read_text()


# --- what may import what ---------------------------------------------------------------------------
PACKAGE = ROOT / "constructs" / "eks_pd_serving"


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """file -> the top-level names of every module it imports (absolute imports only)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(folder))] = names
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"), [("k8s", "aws_cdk"), ("lifecycle", "aws_cdk"), ("lifecycle", "cdk8s")]
)
def test_the_cdk_free_parts_import_no_cdk(folder: str, forbidden: str) -> None:
    # The charts know nothing of CloudFormation; the lifecycle model reads plain JSON.
    offenders = [f for f, names in imported_modules(PACKAGE / folder).items() if forbidden in names]
    assert offenders == []


def reaches_outside(folder: Path) -> dict[str, list[str]]:
    """file -> the package modules it imports from outside ``folder`` by relative import
    (``from ..endpoint import proxy`` is ``endpoint``)."""
    import ast

    found: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        depth = len(path.relative_to(folder).parts)  # 1: directly in folder
        names = [
            (node.module or "").split(".")[0] or node.names[0].name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level > depth
        ]
        if names:
            found[str(path.relative_to(folder))] = names
    return found


# The package's vocabulary every layer shares: modules that import nothing of the package.
VOCABULARY = ("phase",)


def test_the_charts_import_no_feature_they_take_plain_props() -> None:
    """Nothing under k8s/ imports a feature folder: the pods' programs (the key check, the GCS token
    reader, the KV guard) reach the charts as data in their props, filled by the mapping. The
    vocabulary (``Phase``) is no feature, and imports nothing of the package itself."""
    found = {f: [n for n in names if n not in VOCABULARY] for f, names in reaches_outside(PACKAGE / "k8s").items()}
    assert {f: names for f, names in found.items() if names} == {}
    for module in VOCABULARY:
        assert "from ." not in (PACKAGE / f"{module}.py").read_text()


def test_the_relative_import_check_sees_an_offender(tmp_path: Path) -> None:
    (tmp_path / "chart.py").write_text("from ..endpoint import proxy\nfrom .specs import x\nfrom . import specs\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.py").write_text("from .. import specs\nfrom ...fault_tolerance.auth import KEY\n")
    assert reaches_outside(tmp_path) == {"chart.py": ["endpoint"], "sub/deep.py": ["fault_tolerance"]}


def test_the_import_check_sees_an_offender(tmp_path: Path) -> None:
    (tmp_path / "chart.py").write_text("from aws_cdk import Stack\n")
    (tmp_path / "relative.py").write_text("from .specs import x\nimport cdk8s.plus\n")
    assert imported_modules(tmp_path) == {"chart.py": {"aws_cdk"}, "relative.py": {"cdk8s"}}


# --- the construct as a pipeline consumes it ----------------------------------------------------
EXAMPLE = ROOT / "examples" / "account_vending"


@pytest.fixture(scope="module")
def installed_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository built as a wheel and installed into a folder of its own."""
    build = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = tmp_path_factory.mktemp("source") / "eks-pd-serving"
    skip = shutil.ignore_patterns(".git", ".venv*", "node_modules", "cdk.out", "build", ".rehearsal", "*.egg-info")
    shutil.copytree(ROOT, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(build), str(source)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (wheel,) = build.glob("eks_pd_serving-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = {
        "eks_pd_serving/k8s/ray_service.py",
        "eks_pd_serving/cli/verify.py",
        "eks_pd_serving/lifecycle/rules/destroy.py",
        "eks_pd_serving/policies/cluster-autoscaler-v1.35.2.json",
    }
    assert expected <= set(names)
    assert not any(n.startswith(("constructs/", "k8s/", "stacks/", "tests/")) for n in names)
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return site


def run_example(app_dir: Path, outdir: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(pythonpath),
        "CDK_OUTDIR": str(outdir),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    code = "import runpy, eks_pd_serving; print(eks_pd_serving.__file__); runpy.run_path('app.py', run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=app_dir, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_separate_app_synthesizes_two_deployments_from_the_installed_package(
    installed_package: Path, tmp_path: Path
) -> None:
    app_dir = tmp_path / "pipeline"
    app_dir.mkdir()
    shutil.copy(EXAMPLE / "app.py", app_dir / "app.py")  # outside the repository: no cdk.json, no source tree
    result = run_example(app_dir, tmp_path / "cdk.out", installed_package)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[0].startswith(str(installed_package)), "imported the source tree, not the package"
    templates = {p.name: json.loads(p.read_text()) for p in (tmp_path / "cdk.out").glob("*.template.json")}
    assert set(templates) == {"LlmServing-search.template.json", "LlmServing-assist.template.json"}
    sizes = {
        name: sorted(
            r["Properties"]["ScalingConfig"]["DesiredSize"]
            for r in t["Resources"].values()
            if r["Type"] == "AWS::EKS::Nodegroup"
        )
        for name, t in templates.items()
    }
    assert sizes == {"LlmServing-search.template.json": [1, 2], "LlmServing-assist.template.json": [1, 1, 3]}


def test_the_example_app_synthesizes_from_the_source_tree(tmp_path: Path) -> None:
    result = run_example(EXAMPLE, tmp_path / "cdk.out", ROOT / "constructs")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "cdk.out").glob("*.template.json"))) == 2


def test_version_and_changelog_agree() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"## {version} (" in (ROOT / "CHANGELOG.md").read_text()
    import eks_pd_serving

    assert eks_pd_serving.__version__ == version


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    import importlib

    import eks_pd_serving

    for name in eks_pd_serving.__all__:
        if name == "__version__":
            continue
        module = importlib.import_module(f"eks_pd_serving.{eks_pd_serving._EXPORTS[name]}")
        assert getattr(eks_pd_serving, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = eks_pd_serving.Nope


def test_observability_re_exports_every_public_name_of_its_cdk_free_modules() -> None:
    import ast

    from eks_pd_serving import observability

    for module_name in ("catalogue", "promql", "agent"):
        tree = ast.parse((PACKAGE / "observability" / f"{module_name}.py").read_text())
        defined = set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            elif isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        public = {name for name in defined if not name.startswith("_")}
        assert public and public <= set(observability.__all__), sorted(public - set(observability.__all__))


def exposure_comparisons(root: Path) -> list[str]:
    """Places that compare ``endpoint_exposure`` with a name (``== "internal"`` and the like)."""
    pattern = re.compile(r"""endpoint_exposure\s*[!=]=\s*["']""")
    return sorted(
        str(path.relative_to(root)) for path in root.rglob("*.py") for line in path.read_text().splitlines()
        if pattern.search(line)
    )  # fmt: skip


def test_the_exposure_is_compared_in_one_place(tmp_path: Path) -> None:
    """``internal_endpoint`` (config/derived.py) is the one reading of the exposure's name (it was
    compared at six sites); a new comparison elsewhere is refused here."""
    assert exposure_comparisons(PACKAGE) == ["config/derived.py"]
    broken = tmp_path / "pkg"
    shutil.copytree(PACKAGE, broken, ignore=shutil.ignore_patterns("__pycache__"))
    verify = broken / "cli" / "verify.py"
    verify.write_text(
        verify.read_text().replace("settings.internal_endpoint", 'settings.endpoint_exposure == "internal"')
    )
    assert exposure_comparisons(broken) == ["cli/verify.py", "config/derived.py"]


def settings_read(source: str) -> list[str]:
    """``config.<name>`` and ``self.config.<name>`` reads in ``source`` (passing ``config`` on to
    the mapping is not a read)."""
    import ast

    def is_config(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "config") or (
            isinstance(node, ast.Attribute) and node.attr == "config"
        )

    return sorted(
        node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute) and is_config(node.value)
    )


def test_the_composition_reads_no_setting() -> None:
    """``PdServing`` composes and orders; every setting it needs comes from ``mapping.plan`` (or a
    mapping function it hands ``config`` to), so there is one mapping to read and to change."""
    assert settings_read((PACKAGE / "pd_serving.py").read_text()) == []


def test_the_settings_read_check_sees_an_offender() -> None:
    source = (PACKAGE / "pd_serving.py").read_text()
    broken = source.replace("retention_days=plan.log_retention_days", "retention_days=config.log_retention_days")
    assert broken != source
    assert settings_read(broken) == ["log_retention_days"]
    assert settings_read("x = self.config.cluster_name\nmapping.plan(config)\n") == ["cluster_name"]
