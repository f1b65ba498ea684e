"""How long `cdk synth` of this app takes against a bare aws_eks_v2 cluster app, on this machine.

The bare app is one stack with one ``aws_eks_v2.Cluster`` of the pinned Kubernetes version and its
kubectl layer: the floor any EKS app pays (Python's and Node's start, the aws_cdk import, the
cluster's custom resources, the kubectl layer's asset). Both run through the pinned CDK CLI,
alternately, so that a busy machine slows both alike; it prints each run and the medians' ratio.

    .venv/bin/python -m tools.bench_synth            # 5 runs of each
    .venv/bin/python -m tools.bench_synth --runs 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eks_pd_serving import versions

ROOT = Path(__file__).resolve().parents[1]
CDK = ROOT / "node_modules" / ".bin" / "cdk"

BARE_APP = """
import importlib
import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
app = cdk.App()
stack = cdk.Stack(app, "Bare")
layer_class = getattr(importlib.import_module({module!r}), {cls!r})
eks.Cluster(stack, "Cluster", version=eks.KubernetesVersion.of({version!r}),
            kubectl_provider_options=eks.KubectlProviderOptions(kubectl_layer=layer_class(stack, "Kubectl")))
app.synth()
"""


def synth_seconds(app: str | None, outdir: Path) -> float:
    """One `cdk synth --quiet` (this app's own command from cdk.json when ``app`` is None)."""
    command = [str(CDK), "synth", "--quiet", "-o", str(outdir)] + (["-a", app] if app else [])
    # Python writes its bytecode as on a user's machine (this sandbox's shell turns that off, and
    # then every run compiles aws_cdk's modules anew).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each app (default 5)")
    args = parser.parse_args(argv)
    release = versions.KUBERNETES_RELEASES[versions.DEFAULT_KUBERNETES_VERSION]
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_app.py"
        bare.write_text(BARE_APP.format(module=release.kubectl_layer_module, cls=release.kubectl_layer_class,
                                        version=versions.DEFAULT_KUBERNETES_VERSION))  # fmt: skip
        bare_app = f"{sys.executable} {bare}"
        synth_seconds(None, Path(tmp) / "warm")  # the first run fills caches (bytecode, Node's)
        ours, floor = [], []
        for run in range(args.runs):
            ours.append(synth_seconds(None, Path(tmp) / f"ours{run}"))
            floor.append(synth_seconds(bare_app, Path(tmp) / f"bare{run}"))
            print(f"run {run + 1}: this app {ours[-1]:.2f} s, bare cluster app {floor[-1]:.2f} s")
    ratio = statistics.median(ours) / statistics.median(floor)
    print(f"median of {args.runs}: this app {statistics.median(ours):.2f} s, "
          f"bare cluster app {statistics.median(floor):.2f} s, ratio {ratio:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
