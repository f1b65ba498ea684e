"""Validate what ``verify`` reads from Ray's dashboard (``/api/serve/applications/``) with Ray's own
``ray.serve.schema.ApplicationDetails``, at the image's Ray version: each application's status, its
``deployed_app_config.args``, each deployment's status and its replicas' ``node_ip``.

Runs in the Ray virtualenv (.venv-ray), never in the CDK one:

    .venv-ray/bin/python tools/validate_serve_details.py <applications.json>

The file holds the dashboard's answer as a test builds it (``{"applications": {name: {...}}}``);
the fields the dashboard always sends and verify never reads (messages, times, a deployment's
config) are filled in here. Exit 1 with Ray's message when a field is not Ray's."""

from __future__ import annotations

import json
import sys
from typing import Any


def full(app: dict[str, Any]) -> dict[str, Any]:
    """``app`` with what Ray's model requires beside the fields verify reads."""
    deployments = {
        name: {
            "message": "",
            "status_trigger": "CONFIG_UPDATE_COMPLETED",
            "deployment_config": {"name": name},
            "target_num_replicas": len(deployment.get("replicas") or []),
            "required_resources": {},
            **deployment,
            "replicas": [
                {"start_time_s": 0.0, "replica_id": f"r{index}", **replica}
                for index, replica in enumerate(deployment.get("replicas") or [])
            ],
        }
        for name, deployment in (app.get("deployments") or {}).items()
    }
    route = (app.get("deployed_app_config") or {}).get("route_prefix")
    base = {"route_prefix": route, "docs_path": None, "message": "", "last_deployed_time_s": 0.0}
    return {**base, "source": "declarative", "external_scaler_enabled": False, **app, "deployments": deployments}


def main(path: str) -> int:
    from pydantic import ValidationError
    from ray.serve.schema import ApplicationDetails

    with open(path) as file:
        apps = json.load(file)["applications"]
    for name, app in apps.items():
        try:
            parsed = json.loads(ApplicationDetails.model_validate(full(app)).model_dump_json(warnings=False))
        except ValidationError as error:
            print(f"application {name}: not Ray's ApplicationDetails: {error}", file=sys.stderr)
            return 1
        read = (parsed["status"], parsed["deployed_app_config"]["args"])
        if read != (app["status"], app["deployed_app_config"]["args"]):
            print(f"application {name}: Ray's model changed what verify reads: {read}", file=sys.stderr)
            return 1
        for deployment_name, deployment in app["deployments"].items():
            got = parsed["deployments"][deployment_name]
            if got["status"] != deployment["status"] or [r["node_ip"] for r in got["replicas"]] != [
                r["node_ip"] for r in deployment["replicas"]
            ]:
                print(f"{name}/{deployment_name}: Ray's model changed what verify reads", file=sys.stderr)
                return 1
    print(f"Ray's ApplicationDetails accepted {len(apps)} applications")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
