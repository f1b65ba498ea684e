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
4. With the package's failover builder (``eks_pd_failover:build_failover_app``): its own args key
   taken off (its keys must be the builder's ``Failover`` fields, read from the pod module's
   source, which imports vLLM too), the rest is PDServingArgs as above.

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


def failover_contract() -> tuple[str, str, set[str]]:
    """The failover builder's import path, args key and the fields its ``Failover`` takes."""
    tree = ast.parse(FAILOVER_SOURCE.read_text())
    constants = {
        t.id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id in ("IMPORT_PATH", "ARGS_KEY")
    }
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Failover")
    fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return constants["IMPORT_PATH"], constants["ARGS_KEY"], fields


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
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(serve_config)
    pd_args = pd_serving_args_class()
    report = []
    failover_path, failover_key, failover_fields = failover_contract()
    for app in schema.applications:
        given = dict(app.args)
        if app.import_path == failover_path:
            failover = given.pop(failover_key, None)
            if not isinstance(failover, dict) or set(failover) != failover_fields:
                raise ValueError(
                    f"application {app.name!r}: {failover_key} is {failover!r}, expected the keys "
                    f"{sorted(failover_fields)}"
                )
        elif app.import_path != PD_IMPORT_PATH:
            raise ValueError(
                f"application {app.name!r}: import_path is {app.import_path!r}, expected {PD_IMPORT_PATH!r} "
                f"or {failover_path!r}"
            )
        args = pd_args.model_validate(given)  # type: ignore[attr-defined]
        roles = [
            f"{side} {getattr(args, f'{side}_config').engine_kwargs['kv_transfer_config']['kv_role']}"
            for side in ("prefill", "decode")
        ]
        report.append(
            f"ray {ray.__version__}: application {app.name!r} accepted: "
            f"model {args.decode_config.model_id!r}, {', '.join(roles)}"
        )
    return report


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
