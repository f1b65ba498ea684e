"""Versions that must move together (versions.py) agree with what the project installs."""

from __future__ import annotations

import re
import tomllib

import pytest
from support import ROOT, SHARED

from eks_pd_serving import versions


def pins(path: str) -> dict[str, str]:
    """``{package: version}`` of every ``name==version`` line (extras dropped)."""
    found = {}
    for line in (ROOT / path).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s#]+)", line.strip())
        if match:
            found[match.group(1).lower()] = match.group(3)
    return found


def project_pins() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split("==")[0].lower(): d.split("==")[1] for d in dependencies if "==" in d}


@pytest.mark.parametrize("source", [pins("requirements.txt"), project_pins()], ids=["requirements", "pyproject"])
def test_aws_cdk_lib_and_every_kubectl_layer_are_pinned_where_installed(source: dict[str, str]) -> None:
    assert source["aws-cdk-lib"] == versions.AWS_CDK_LIB_VERSION
    for release in versions.KUBERNETES_RELEASES.values():
        assert release.kubectl_layer_package.lower() in source, release.version


def test_the_ray_venv_pins_the_images_ray() -> None:
    assert pins("requirements-ray.txt")["ray"] == versions.RAY_VERSION


def test_kuberay_crds_in_shared_are_the_pinned_release() -> None:
    chart = SHARED / "kuberay" / versions.KUBERAY_VERSION.join(("v", "")) / "Chart.yaml"
    if not chart.exists():
        pytest.skip(f"{chart} not found (../shared is beside the checkout in CI)")
    assert re.search(rf"^version: v?{re.escape(versions.KUBERAY_VERSION)}$", chart.read_text(), re.M)


def test_every_supported_kubernetes_version_has_support_dates_and_none_is_retired() -> None:
    assert set(versions.KUBERNETES_RELEASES) <= set(versions.EKS_STANDARD_SUPPORT_ENDS)
    assert not set(versions.KUBERNETES_RELEASES) & set(versions.RETIRED_KUBERNETES_VERSIONS)
    assert versions.DEFAULT_KUBERNETES_VERSION in versions.KUBERNETES_RELEASES


def test_a_bumped_pin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails when aws-cdk-lib moves without versions.py."""
    monkeypatch.setattr(versions, "AWS_CDK_LIB_VERSION", "2.999.0")
    with pytest.raises(AssertionError):
        test_aws_cdk_lib_and_every_kubectl_layer_are_pinned_where_installed(pins("requirements.txt"))


@pytest.mark.parametrize("source", [pins("requirements.txt"), project_pins()], ids=["requirements", "pyproject"])
def test_cdk8s_plus_matches_the_default_kubernetes_version(source: dict[str, str]) -> None:
    """Moving the default Kubernetes version must move the cdk8s-plus package with it."""
    plus = [name for name in source if name.startswith("cdk8s-plus-")]
    assert plus == [f"cdk8s-plus-{versions.DEFAULT_KUBERNETES_VERSION.split('.')[1]}"]
