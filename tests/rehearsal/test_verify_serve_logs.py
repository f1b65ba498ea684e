"""`verify` reads Serve's controller and replica log files through a real Ray dashboard's log API
(the rehearsal's Ray 2.60 with its dashboard, one Serve deployment), and the replica start split
finds the start in them."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time

import pytest

from eks_pd_serving.cli import verify
from eks_pd_serving.observability import replica_start

CLUSTER = textwrap.dedent(
    """
    import sys, time, ray
    from ray import serve
    context = ray.init(num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1")

    @serve.deployment
    class Echo:
        def __call__(self, request):
            return "x"

    serve.run(Echo.bind(), name="echo")
    print("http://" + context.dashboard_url, ray.util.get_node_ip_address(), flush=True)
    sys.stdin.read()  # until the test closes it
    serve.shutdown()
    ray.shutdown()
    """
)


@pytest.mark.skipif(not os.environ.get("EKS_PD_REHEARSE_PYTHON"), reason="needs the rehearsal virtualenv (make test)")
def test_verify_reads_serves_log_files_through_the_dashboard() -> None:
    # Ray 2.60 turns token auth on by default; the deployed Ray 2.58 cluster runs without it.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cluster = subprocess.Popen([os.environ["EKS_PD_REHEARSE_PYTHON"], "-c", CLUSTER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert cluster.stdout is not None
        dashboard, node_ip = cluster.stdout.readline().split()
        lines = []
        for _ in range(30):  # the dashboard's agent lists the files once it is up
            try:
                lines = verify.serve_log_lines(dashboard, node_ip)
            except Exception:  # not up yet
                lines = []
            if any("started successfully" in line for line in lines):
                break
            time.sleep(2)
        (start,) = replica_start.replica_starts(lines)
        assert (start.app, start.deployment) == ("echo", "Echo")
        assert start.running is not None and start.parts()["actor"] is not None
    finally:
        if cluster.stdin:
            cluster.stdin.close()
        cluster.wait(timeout=60)
