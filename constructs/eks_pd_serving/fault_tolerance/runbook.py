"""What an operator runs when a fault needs a hand, each as a program for the Ray head's
container: docs/features/failures.md shows the command (tests/unit/test_docs.py holds the page to
``replace_decode_command``), and the fault rehearsal runs the same program against its own Ray."""

from __future__ import annotations

# Ray Serve names a replica's actor SERVE_REPLICA::<app>#<deployment>#<id> (Ray 2.58 and 2.60, seen
# in both logs), and Ray Serve LLM a decode deployment Decode:<model> (k8s.serve_config: its
# application is <model>-decode with the failover, pd-openai without). Written out
# (tests/unit/test_docs.py holds them to the serve config): the rehearsal imports this module where
# the cdk8s side of the package is not installed.
REPLICA_PREFIX = "SERVE_REPLICA::"
DECODE_DEPLOYMENT = "#Decode:"

# After KvPullFailed on the image's vLLM 0.26: kill the decode replicas' actors; Serve starts new
# ones, whose engines handshake with prefill afresh. Prints one line: REPLACED_LINE and the
# replicas it killed, as JSON (Ray's own log lines may come around it).
REPLACED_LINE = "replaced decode replicas:"
REPLACE_DECODE = "; ".join(
    [
        "import json, ray",
        "ray.init(address='auto', logging_level='ERROR')",
        "found = [a for a in ray.util.list_named_actors(all_namespaces=True)"
        f" if a['name'].startswith('{REPLICA_PREFIX}') and '{DECODE_DEPLOYMENT}' in a['name']]",
        "[ray.kill(ray.get_actor(a['name'], namespace=a['namespace'])) for a in found]",
        f"print('{REPLACED_LINE}', json.dumps(sorted(a['name'] for a in found)))",
    ]
)


def replace_decode_command(namespace: str = "inference") -> str:
    """The shell lines that run ``REPLACE_DECODE`` in the head pod's Ray container."""
    return (
        f"HEAD=$(kubectl -n {namespace} get pods -l ray.io/node-type=head -o name)\n"
        f'kubectl -n {namespace} exec "$HEAD" -c ray-head -- python -c "{REPLACE_DECODE}"'
    )
