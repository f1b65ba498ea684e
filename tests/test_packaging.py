"""The `constructs/` folder must not shadow the `constructs` library, and versions agree."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from conftest import ROOT

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
