"""The deployed API key check on this machine: the ConfigMap's file from the template on the
local Serve proxy's PYTHONPATH, loaded by the same hook the pods set; the keys in moto's Secrets
Manager on 127.0.0.1, read through boto3 as a pod reads them. Then what an OpenAI client sees:
the official SDK with the key (models, chat, streamed chat with usage, completions), every route
without one or with a wrong one, and a rotation (a key added, the old one removed) with no
process restarted. Nothing here prints or records a key."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.endpoint import proxy

from . import local_aws
from .local_aws import moto_server
from .probes import Endpoint, ProbeFailed
from .processes import marked_processes

FIRST_ID, ROTATED_ID = "rehearsal", "rotated"
# The deployed 30 s would make each rotation step wait half a minute; the bound scales with it.
LOCAL_REFRESH_S = 2
KEY_ENV = "EKS_PD_REHEARSAL_API_KEY"  # a caller's own first key (a test greps for it)
# Without a key, each must be refused (Ray Serve LLM's routes, Serve's route table, a path nothing serves).
REFUSED = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/-/routes"),
    ("GET", "/no-such-route"),
]


@dataclass
class LocalKeys:
    env: dict[str, str]  # for Ray (the proxies): the hook, the code, the secret, moto's endpoint
    key: str
    secret_id: str
    client: Any  # boto3's secretsmanager client on moto
    deployed_refresh_s: int


def deployed_code(template_file: Path) -> tuple[str, dict[str, str]] | None:
    """The check's source (the ConfigMap's file) and the workers' env, if the template runs it."""
    objects = kubernetes_objects(json.loads(template_file.read_text()), "us-east-1")
    maps = [o for o in objects if o.get("kind") == "ConfigMap" and proxy.FILE_NAME in o.get("data", {})]
    (service,) = [o for o in objects if o.get("kind") == "RayService"]
    (group, *_) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    env = {e["name"]: e.get("value", "") for e in group["template"]["spec"]["containers"][0].get("env", [])}
    if proxy.SECRET_ENV not in env:  # the proxy hook is always on (the body's bound); keys are not
        return None
    (config_map,) = maps
    return config_map["data"][proxy.FILE_NAME], env


@contextlib.contextmanager
def local_keys(template_file: Path, work: Path, port: int) -> Iterator[LocalKeys | None]:
    deployed = deployed_code(template_file)
    if deployed is None:
        yield None
        return
    source, env = deployed
    code = work / "api-keys-code"
    code.mkdir(parents=True, exist_ok=True)
    (code / proxy.FILE_NAME).write_text(source)
    with moto_server(port) as endpoint:
        client = local_aws.client("secretsmanager", endpoint)
        key = os.environ.get(KEY_ENV) or secrets.token_urlsafe(36)
        secret_id = client.create_secret(Name="rehearsal-api-keys", SecretString=json.dumps({FIRST_ID: key}))["ARN"]
        local_env = {
            **local_aws.CREDENTIALS,
            proxy.CALLBACK_ENV: env[proxy.CALLBACK_ENV],
            # The deployed PYTHONPATH is the mount; here the same file is in ``code``.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])),
            proxy.SECRET_ENV: secret_id,
            proxy.REFRESH_ENV: str(LOCAL_REFRESH_S),
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": endpoint,
        }
        yield LocalKeys(local_env, key, secret_id, client, int(env[proxy.REFRESH_ENV]))


def _sdk(endpoint: Endpoint, key: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{endpoint.base_url}/v1", api_key=key, max_retries=0, timeout=120)


def _sdk_probes(endpoint: Endpoint, key: str) -> dict[str, Any]:
    """The usual client calls; raises what the SDK raises."""
    client = _sdk(endpoint, key)
    models = [m.id for m in client.models.list().data]
    messages = [{"role": "user", "content": "Say hello."}]
    chat = client.chat.completions.create(model=endpoint.model_id, messages=messages, max_tokens=8, temperature=0)
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model=endpoint.model_id, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    completion = client.completions.create(
        model=endpoint.model_id, prompt="The quick brown fox", max_tokens=8, temperature=0
    )
    return {
        "models": models,
        "chat": chat.choices[0].message.content,
        "stream": "".join(pieces),
        "stream_usage": usage.model_dump() if usage else None,
        "completion": completion.choices[0].text,
    }


def _refused_by_sdk(endpoint: Endpoint, key: str) -> dict[str, Any]:
    """Each SDK call with ``key``: the exception's class and status (None if it went through)."""
    import openai

    client = _sdk(endpoint, key)
    model, hi = endpoint.model_id, [{"role": "user", "content": "hi"}]
    calls: dict[str, Callable[[], Any]] = {
        "models": lambda: client.models.list(),
        "chat": lambda: client.chat.completions.create(model=model, messages=hi, max_tokens=2),
        "stream": lambda: list(client.chat.completions.create(model=model, messages=hi, max_tokens=2, stream=True)),
        "completion": lambda: client.completions.create(model=model, prompt="hi", max_tokens=2),
    }
    seen: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = None
        except openai.APIStatusError as error:
            seen[name] = {"error": type(error).__name__, "status": error.status_code, "code": error.code}
    return seen


def _without_key(endpoint: Endpoint) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with httpx.Client(base_url=endpoint.base_url, timeout=30) as client:
        for method, path in REFUSED:
            path = path.format(model=endpoint.model_id)
            response = client.request(method, path, json={"model": endpoint.model_id} if method == "POST" else None)
            body = response.json() if response.headers.get("content-type") == "application/json" else {}
            found[f"{method} {path}"] = {"status": response.status_code, "code": body.get("error", {}).get("code")}
        found["GET /-/healthz"] = {"status": client.get("/-/healthz").status_code, "code": None}
    return found


def _serving_processes(run_id: str) -> list[int]:
    """The PIDs of this run's Serve proxy and replica processes (engines included)."""
    return sorted(p.pid for p in marked_processes(run_id, "ServeReplica", "ProxyActor"))


def _until(condition: Any, bound_s: float) -> float | None:
    """Seconds until ``condition()`` held, or None if it did not within ``bound_s``."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def _accepted(endpoint: Endpoint, key: str) -> bool:
    with httpx.Client(base_url=endpoint.base_url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:
        return client.get("/v1/models").status_code == 200


def probe(endpoint: Endpoint, keys: LocalKeys, run_id: str, log: Any = print) -> tuple[dict[str, Any], list[str]]:
    """Everything a client sees of the check, then a rotation (after which the first key is added
    back, for the probes that follow); the report, and the keys used (for scan_logs)."""
    import ray

    report: dict[str, Any] = {"deployed_refresh_s": keys.deployed_refresh_s, "local_refresh_s": LOCAL_REFRESH_S}
    report["session_dir"] = ray._private.worker._global_node.get_session_dir_path()  # where the proxy logs
    report["with_key"] = _sdk_probes(endpoint, keys.key)
    report["without_key"] = _without_key(endpoint)
    report["wrong_key"] = _refused_by_sdk(endpoint, secrets.token_urlsafe(36))
    before = _serving_processes(run_id)
    rotated = secrets.token_urlsafe(36)
    bound_s = 3 * LOCAL_REFRESH_S + 5
    keys.client.put_secret_value(
        SecretId=keys.secret_id, SecretString=json.dumps({FIRST_ID: keys.key, ROTATED_ID: rotated})
    )
    added = _until(lambda: _accepted(endpoint, rotated), bound_s)
    keys.client.put_secret_value(SecretId=keys.secret_id, SecretString=json.dumps({ROTATED_ID: rotated}))
    removed = _until(lambda: not _accepted(endpoint, keys.key), bound_s)
    report["rotation"] = {
        "added_s": added,
        "removed_s": removed,
        "bound_s": bound_s,
        "old_key_after": _refused_by_sdk(endpoint, keys.key),
        "new_key_after": _sdk_probes(endpoint, rotated),
        "processes_before": before,
        "processes_after": _serving_processes(run_id),
    }
    log(f"== api keys: rotation took {added} s to add, {removed} s to remove (bound {bound_s} s)")
    if added is None or removed is None:
        raise ProbeFailed("the rotated key did not take effect within the bound")
    keys.client.put_secret_value(
        SecretId=keys.secret_id, SecretString=json.dumps({FIRST_ID: keys.key, ROTATED_ID: rotated})
    )
    if _until(lambda: _accepted(endpoint, keys.key), bound_s) is None:
        raise ProbeFailed("the first key, added back, was not accepted within the bound")
    return report, [keys.key, rotated]


def scan_logs(session_dir: str, keys: list[str]) -> dict[str, Any]:
    """Every file Ray wrote this run: how many hold a key (must be 0), how many lines name a key id."""
    files = [p for p in Path(session_dir, "logs").rglob("*") if p.is_file()]
    with_key, id_lines = 0, 0
    for path in files:
        text = path.read_text(errors="replace")
        with_key += any(key in text for key in keys)
        id_lines += text.count(f"api_key_id={FIRST_ID}") + text.count(f"api_key_id={ROTATED_ID}")
    return {"files": len(files), "files_with_a_key": with_key, "lines_naming_a_key_id": id_lines}


def judge(report: dict[str, Any]) -> tuple[bool, list[str]]:
    """PASS/FAIL lines for what must hold of the check."""
    with_key, rotation, logs = report["with_key"], report["rotation"], report.get("logs", {})

    def refused(seen: dict[str, Any]) -> bool:
        return all(v is not None and v["error"] == "AuthenticationError" and v["status"] == 401 for v in seen.values())

    def served(probes: dict[str, Any]) -> bool:
        usage = probes["stream_usage"] or {}
        texts = (probes["chat"], probes["stream"], probes["completion"])
        return bool(probes["models"]) and all(texts) and usage.get("completion_tokens", 0) > 0

    without = report["without_key"]
    checks = [
        (served(with_key), "the OpenAI SDK with the key: models, chat, streamed chat with usage, completions"),
        (
            all(v == {"status": 401, "code": "invalid_api_key"} for k, v in without.items() if k != "GET /-/healthz")
            and without["GET /-/healthz"]["status"] == 200,
            f"without a key: 401 invalid_api_key on all {len(without) - 1} routes tried; /-/healthz answers 200",
        ),
        (refused(report["wrong_key"]), "with a wrong key: AuthenticationError (401) on every SDK call"),
        (
            refused(rotation["old_key_after"]) and served(rotation["new_key_after"]),
            f"rotation: the new key served within {rotation['added_s']:.1f} s, the removed one refused within "
            f"{rotation['removed_s']:.1f} s (refresh {report['local_refresh_s']} s here, "
            f"{report['deployed_refresh_s']} s deployed)"
            if rotation["added_s"] is not None and rotation["removed_s"] is not None
            else "rotation: did not take effect",
        ),
        (
            bool(rotation["processes_before"]) and rotation["processes_before"] == rotation["processes_after"],
            f"rotation restarted nothing ({len(rotation['processes_before'])} proxy and replica processes, same PIDs)",
        ),
        (
            logs.get("files_with_a_key") == 0 and logs.get("lines_naming_a_key_id", 0) > 0,
            f"no key in any of Ray's {logs.get('files', 0)} log files; "
            f"{logs.get('lines_naming_a_key_id', 0)} lines name a key id",
        ),
    ]
    return all(ok for ok, _ in checks), [f"{'PASS' if ok else 'FAIL'}: api keys: {line}" for ok, line in checks]
