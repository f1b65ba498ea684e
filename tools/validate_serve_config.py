"""Validate a RayService's serveConfigV2 with Ray's own models, at the image's Ray version.

Runs in the Ray virtualenv (.venv-ray, requirements-ray.txt), never in the CDK one:

    .venv-ray/bin/python tools/validate_serve_config.py <rayservice.json|serve_config.yaml>

Checks, all with Ray's code:
1. ``ray.serve.schema.ServeDeploySchema`` on the whole Serve config;
2. ``LLMConfig`` (``ray.llm._internal.serve.core.configs.llm_config``) on each side;
3. ``PDServingArgs``: its class source is read from this Ray's ``prefill_decode/builder.py`` and
   executed against the real ``LLMConfig``. That module cannot be imported without vLLM (it
   imports vLLM's protocol models), so the ingress/proxy class options, which only name
   classes, are accepted as plain dicts here.
4. With the package's failover layout (``eks_pd_failover``'s builders, one application per phase
   and one ingress): each phase's ``llm_config`` is an ``LLMConfig``, its deployment override is
   named as Ray's ``_get_deployment_name`` (read from this Ray's ``core/server/builder.py``) names
   it, the two phases of each model validate together as ``PDServingArgs``, agree on their pair
   key, and name each other's application and deployment; the failover's ``user_config`` keys are
   the builder's ``Failover`` fields (read from the pod module's source, which imports vLLM).

Exit 0 when Ray accepts the config, 1 with Ray's message when it does not.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

import yaml

PD_IMPORT_PATH = "ray.serve.llm:build_pd_openai_app"
_BUILDER = "ray.llm._internal.serve.serving_patterns.prefill_decode.builder"
FAILOVER_SOURCE = (
    Path(__file__).resolve().parents[1] / "constructs/eks_pd_serving/fault_tolerance/failover/eks_pd_failover.py"
)


def failover_contract() -> tuple[dict[str, str], set[str]]:
    """The failover builders' import paths by role and the fields its ``Failover`` takes."""
    tree = ast.parse(FAILOVER_SOURCE.read_text())
    constants = {
        t.id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id == "IMPORT_PATHS"
    }
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Failover")
    fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return constants["IMPORT_PATHS"], fields


def ray_deployment_name() -> Any:
    """Ray's own ``_get_deployment_name`` (it cannot be imported without vLLM)."""
    builder = importlib.util.find_spec("ray.llm._internal.serve.core.server.builder")
    assert builder is not None and builder.origin is not None
    tree = ast.parse(Path(builder.origin).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_get_deployment_name")
    namespace: dict[str, Any] = {"LLMConfig": Any}
    exec(compile(ast.Module(body=[node], type_ignores=[]), builder.origin, "exec", dont_inherit=True), namespace)
    return namespace["_get_deployment_name"]


def load_serve_config(path: Path) -> dict[str, Any]:
    text = path.read_text()
    document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if isinstance(document, dict) and document.get("kind") == "RayService":
        return typing.cast(dict[str, Any], yaml.safe_load(document["spec"]["serveConfigV2"]))
    return typing.cast(dict[str, Any], document)


def pd_serving_args_class() -> type:
    """Ray's own PDServingArgs class body, bound to Ray's own LLMConfig."""
    import pydantic
    from ray.llm._internal.common.base_pydantic import BaseModelExtended
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    spec = importlib.util.find_spec(_BUILDER)
    assert spec is not None and spec.origin is not None, f"{_BUILDER} not found in this Ray"
    tree = ast.parse(Path(spec.origin).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PDServingArgs")
    namespace: dict[str, Any] = {
        **{name: getattr(typing, name) for name in ("Any", "Optional", "Union")},
        "Field": pydantic.Field,
        "field_validator": pydantic.field_validator,
        "model_validator": pydantic.model_validator,
        "warnings": warnings,
        "BaseModelExtended": BaseModelExtended,
        "LLMConfig": LLMConfig,
        # Need vLLM to import; they only name classes to load at build time.
        "IngressClsConfig": dict,
        "ProxyClsConfig": dict,
    }
    code = compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec", dont_inherit=True)
    exec(code, namespace)
    return typing.cast(type, namespace["PDServingArgs"])


def validate(serve_config: dict[str, Any]) -> list[str]:
    """Return one line per validated application; raise Ray's error on the first rejection."""
    import ray
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(serve_config)
    pd_args = pd_serving_args_class()
    paths, failover_fields = failover_contract()
    roles = {path: role for role, path in paths.items()}
    apps = {app["name"]: app for app in serve_config["applications"]}
    report = []
    phases: dict[str, dict[str, Any]] = {}  # decode app name -> its phases' configs
    for app in schema.applications:
        given = dict(app.args)
        role = roles.get(app.import_path)
        if app.import_path == PD_IMPORT_PATH:
            args = pd_args.model_validate(given)  # type: ignore[attr-defined]
            kv = [f"{side} {getattr(args, f'{side}_config').engine_kwargs['kv_transfer_config']['kv_role']}"
                  for side in ("prefill", "decode")]  # fmt: skip
            report.append(
                f"ray {ray.__version__}: application {app.name!r} accepted: "
                f"model {args.decode_config.model_id!r}, {', '.join(kv)}"
            )
            continue
        if role is None:
            raise ValueError(f"application {app.name!r}: import_path {app.import_path!r} is neither Ray's nor ours")
        overrides = {d["name"]: d for d in apps[app.name].get("deployments") or []}
        for name, override in overrides.items():
            if override.get("autoscaling_config") is not None:  # as Serve builds it when it applies the override
                AutoscalingConfig(**override["autoscaling_config"])
            if role in ("decode", "ingress") and set(override.get("user_config") or {}) != failover_fields:
                raise ValueError(
                    f"application {app.name!r}: {name}'s user_config keys are "
                    f"{sorted(override.get('user_config') or {})},"
                    f" expected {sorted(failover_fields)}"
                )
        if role == "ingress":
            for model in given["models"]:
                for phase in ("decode", "prefill"):
                    where = model[phase]
                    if where["deployment"] not in {d.get("name") for d in apps[where["app"]].get("deployments") or []}:
                        raise ValueError(
                            f"application {app.name!r}: {model['model_id']}'s {phase} is {where}, not in the config"
                        )
            report.append(
                f"ray {ray.__version__}: application {app.name!r} accepted: ingress of {len(given['models'])} model(s)"
            )
            continue
        allowed = {"llm_config", "pair"} | ({"prefill"} if role == "decode" else set())
        if set(given) - {"covered"} != allowed:
            raise ValueError(
                f"application {app.name!r}: a phase's args are {sorted(allowed)} and covered; got {sorted(given)}"
            )
        # The Ray and vLLM pairs the failover's record covers (an engine refuses to start on others).
        if "covered" in given and ray.__version__ not in {pair[0] for pair in given["covered"]}:
            raise ValueError(
                f"application {app.name!r}: its engines would refuse to start on Ray {ray.__version__}: "
                f"covered is {given['covered']}"
            )
        if role == "decode":
            where = given["prefill"]
            if where.get("deployment") not in {
                d.get("name") for d in apps.get(where.get("app"), {}).get("deployments") or []
            }:
                raise ValueError(f"application {app.name!r}: its prefill is {where}, not in the config")
        config = LLMConfig.model_validate(given["llm_config"])
        expected = ("Prefill:" if role == "prefill" else "Decode:") + ray_deployment_name()(config)
        if set(overrides) != {expected}:
            raise ValueError(f"application {app.name!r}: overrides name {sorted(overrides)}, Ray names it {expected!r}")
        key = app.name if role == "decode" else next(
            name for name, other in apps.items()
            if (other.get("args") or {}).get("prefill", {}).get("app") == app.name
        )  # fmt: skip
        phases.setdefault(key, {})[role] = given
        report.append(
            f"ray {ray.__version__}: application {app.name!r} accepted: {role} of {config.model_id!r}, "
            f"{config.engine_kwargs.get('kv_transfer_config', {}).get('kv_role')}, deployment {expected!r}"
        )
        if set(phases[key]) == {"prefill", "decode"}:
            report.append(_pair(pd_args, key, phases[key], ray.__version__))
    return report


def _pair(pd_args: Any, decode_app: str, pair: dict[str, Any], version: str) -> str:
    """One model's two phases, validated together as Ray's ``PDServingArgs`` and by their pair key."""
    prefill, decode = pair["prefill"], pair["decode"]
    args = pd_args.model_validate({"prefill_config": prefill["llm_config"], "decode_config": decode["llm_config"]})
    if prefill["pair"] != decode["pair"]:
        raise ValueError(
            f"application {decode_app!r}: its pair key {decode['pair']} is not prefill's {prefill['pair']}"
        )
    return (
        f"ray {version}: {decode_app!r} and its prefill accepted together as PDServingArgs "
        f"({args.decode_config.model_id!r}, pair {decode['pair']})"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        for line in validate(load_serve_config(Path(argv[1]))):
            print(line)
    except Exception as error:  # Ray's own message is the point of this tool
        print(f"rejected by Ray: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
