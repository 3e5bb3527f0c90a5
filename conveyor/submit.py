"""``conveyor submit``: send a job to a Ray cluster through Ray's job submission API.

The config is composed and validated here (a wrong key fails before anything is sent), then
shipped, unresolved (``${oc.env:...}`` stays a reference, so no secret travels), as the job's
working directory; on the cluster the job runs ``conveyor run``, whose Ray runtime joins the
cluster through the ``RAY_ADDRESS`` Ray sets for a job's driver.

Secrets: the variables named in ``runtime.forward_env`` are set here, where the user runs
``conveyor submit``, not on the cluster where the job's driver runs. Ray's job API has no private
channel for them (a runtime_env's ``env_vars`` are shown in the job's info and the dashboard, and
its agent logs them), so they travel as one entry of Ray's internal key-value store (in the GCS's
memory, where Ray keeps uploaded packages: no file, no job info, no log), under a random name
that the job's runtime_env does carry; the driver reads the entry, deletes it, sets the variables
in its own environment and forwards them to the workers as ``runtime.forward_env`` says.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.compat import ray_job_put
from conveyor.errors import ConfigError, ConnectError, TransferError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: names, in the job's environment, the internal-KV entry holding the forwarded variables
FORWARDED_ENV = "CONVEYOR_FORWARDED_ENV"
_FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass
class SubmitArgs:
    overrides: list[str] = field(default_factory=list)
    address: str | None = None
    wait: bool = True
    follow: bool = False
    timeout: float = 3600.0
    #: where the run's report.json and manifest.json come back to (default outputs/submitted/<job id>)
    run_dir: str | None = None


def compose(overrides: list[str]) -> Any:
    """The composed config (Hydra's compose API), interpolations left unresolved."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from conveyor.config import hydra_overrides

    try:
        with initialize_config_module(config_module="conveyor.configs", version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=hydra_overrides(overrides))
    except HydraException as exc:
        raise ConfigError(str(exc).splitlines()[0], hint="check the overrides (conveyor run --cfg job shows the config)") from None
    OmegaConf.set_struct(cfg, False)
    return cfg


def submit(args: SubmitArgs, echo: Any = print) -> int:
    from omegaconf import OmegaConf

    from conveyor.config import build_job

    cfg = compose(args.overrides)
    spec = build_job(OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)))  # validate before sending
    _pin_environment_keys(cfg, spec)
    address = args.address or os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_ADDRESS
    client = _client(address)
    env_vars = {EMIT_ENV: "1", **_send_env(client, address, _forwarded(cfg), echo)}
    with tempfile.TemporaryDirectory(prefix="conveyor-submit-") as folder:
        _ship_resume(cfg, Path(folder))
        # the composed job, and the run's logging as `conveyor run` has it (the job's log file; no doubled lines)
        Path(folder, "job.yaml").write_text(_JOB_DEFAULTS + OmegaConf.to_yaml(cfg, resolve=False))
        job_id = client.submit_job(
            entrypoint="conveyor run --config-dir . --config-name job hydra.run.dir=.",
            runtime_env={"working_dir": folder, "env_vars": env_vars},
        )
    echo(f"submitted job {job_id} to {address}")
    if not args.wait:
        return 0
    status = _wait(client, job_id, args, echo)
    logs = client.get_job_logs(job_id)
    if not args.follow:
        echo("\n".join(line for line in logs.rstrip().splitlines() if not line.startswith(RUN_FILES_MARK)))
    run_dir = _bring_back(logs, Path(args.run_dir or f"outputs/submitted/{job_id}"), echo)
    if status != "SUCCEEDED":
        last = [line for line in logs.splitlines() if line.startswith("error:")]
        hint = f"ray job logs {job_id} --address {address}"
        if run_dir is not None and any(line.startswith("hint:") and "resume=" in line for line in logs.splitlines()):
            hint = f"submit it again with resume={run_dir} to load only the partitions that did not commit; {hint}"
        raise TransferError(f"ray job {job_id} {status.lower()}" + (f": {last[-1][7:]}" if last else ""), hint=hint)
    return 0


def _pin_environment_keys(cfg: Any, spec: Any) -> None:
    """Keys a plugin takes from the environment when unset (PostgreSQL's host and port from $PGHOST,
    $PGPORT, as psql does) are resolved here, where the user runs submit, and written into the job:
    the job's driver on the cluster has another environment. Secrets never are (they travel only
    through runtime.forward_env)."""
    for kind in ("source", "sink"):
        conf = getattr(getattr(spec, kind), "config", None)  # a third-party plugin may keep its config otherwise
        for key in getattr(type(conf), "ENVIRONMENT_KEYS", ()):
            if cfg[kind].get(key) is None:
                cfg[kind][key] = getattr(conf, key)


def _client(address: str) -> Any:
    try:
        from ray.job_submission import JobSubmissionClient
    except ModuleNotFoundError:
        raise ConfigError("conveyor submit needs ray", hint="pip install 'conveyor[ray]'") from None
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ray raises ConnectionError / RuntimeError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = "is the cluster's dashboard up? (ray start --head --dashboard-host 127.0.0.1)"
        if "token" in first.lower():
            first = "the cluster requires token authentication"
            hint = "set RAY_AUTH_MODE=token (the token is in ~/.ray/auth_token, or RAY_AUTH_TOKEN)"
        raise ConnectError(f"ray job server {address}: {first}", hint=hint) from None


# --- the run's files: report.json and manifest.json come back from the cluster ---------------------

#: set for a submitted job's driver: print the run's files into the job's log when it ends
EMIT_ENV = "CONVEYOR_EMIT_RUN_FILES"
#: the job-log line that carries them (gzip + base64 JSON: {file name: text}); never printed here
RUN_FILES_MARK = "conveyor-run-files: "
_RUN_FILES = ("report.json", "manifest.json", "partitions.jsonl")


def emit_run_files(run_dir: Path | None) -> None:
    """On a submitted job's driver, once the run ended: its files as one line of the job's log
    (the one channel back that Ray's job API has), for ``conveyor submit`` to write locally.
    They hold the config unresolved (``${oc.env:...}`` stays a reference): no secret."""
    if not os.environ.get(EMIT_ENV) or run_dir is None:
        return
    import base64
    import gzip

    files = {name: (run_dir / name).read_text() for name in _RUN_FILES if (run_dir / name).is_file()}
    if files:
        blob = base64.b64encode(gzip.compress(json.dumps(files).encode())).decode()
        print(RUN_FILES_MARK + blob, flush=True)


def _bring_back(logs: str, run_dir: Path, echo: Any) -> Path | None:
    """Write the files a submitted run printed into ``run_dir`` (here); None when it printed none."""
    import base64
    import gzip

    lines = [line for line in logs.splitlines() if line.startswith(RUN_FILES_MARK)]
    if not lines:
        return None
    files = json.loads(gzip.decompress(base64.b64decode(lines[-1][len(RUN_FILES_MARK):])))
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if name in _RUN_FILES:
            (run_dir / name).write_text(text)
    echo(f"report: {run_dir / 'report.json'} (brought back from the cluster)")
    return run_dir


def _ship_resume(cfg: Any, folder: Path) -> None:
    """``resume=DIR`` naming a run directory here (one brought back by submit): its manifest goes
    with the job, and the job resumes from that copy on the cluster."""
    resume = cfg.get("resume")
    if not resume or not Path(str(resume), "manifest.json").is_file():
        return  # unset, or a directory on the cluster: the driver reads it there
    import shutil

    (folder / "resume").mkdir()
    for name in _RUN_FILES[1:]:
        if Path(str(resume), name).is_file():
            shutil.copy(Path(str(resume), name), folder / "resume" / name)
    cfg.resume = "resume"


_JOB_DEFAULTS = "defaults:\n  - override hydra/job_logging: conveyor\n  - _self_\n"


def _forwarded(cfg: Any) -> list[str]:
    runtime = cfg.get("runtime") or {}
    return [str(name) for name in (runtime.get("forward_env") or [])]


def _send_env(client: Any, address: str, names: list[str], echo: Any) -> dict[str, str]:
    """Put the forwarded variables' values in Ray's internal KV through the dashboard's package
    upload (the one write the job API offers that stays out of the job's info); the job's
    env_vars get only the entry's random name."""
    values = {name: os.environ[name] for name in names if name in os.environ}
    missing = [name for name in names if name not in os.environ]
    if missing:
        echo(f"warning: runtime.forward_env: {', '.join(missing)} not set here: the job's driver must find them on the cluster")
    if not values:
        return {}
    name = f"_ray_pkg_conveyor_env_{secrets.token_hex(16)}.zip"
    try:
        response = ray_job_put(client, name, json.dumps(values).encode())
    except Exception as exc:  # the job client's transport: a refused or dropped connection
        raise ConnectError(f"ray job server {address}: could not hand over runtime.forward_env: {type(exc).__name__}",
                           hint="is the cluster's dashboard up?") from None
    if response.status_code != 200:
        raise ConnectError(f"ray job server {address}: could not hand over runtime.forward_env (HTTP {response.status_code})",
                           hint="set the variables on the cluster instead, or use the connector's password_file")
    return {FORWARDED_ENV: f"gcs://{name}"}


def receive_env() -> list[str]:
    """On the job's driver: take the variables ``conveyor submit`` forwarded (Ray's internal KV,
    deleted once read) into this process's environment; their names (none outside such a job)."""
    uri = os.environ.pop(FORWARDED_ENV, "")
    if not uri:
        return []
    import logging

    import ray

    from conveyor.compat import ray_kv_take

    if not ray.is_initialized():  # the job's cluster (RAY_ADDRESS), which the Ray runtime joins anyway
        ray.init(logging_level=logging.WARNING, log_to_driver=False)
    data = ray_kv_take(uri)
    if data is None:
        raise ConfigError("runtime.forward_env: the values conveyor submit handed over are gone (read by another driver?)",
                          key="runtime.forward_env", hint="submit the job again")
    values = json.loads(data)
    os.environ.update(values)
    return sorted(values)


def _wait(client: Any, job_id: str, args: SubmitArgs, echo: Any) -> str:
    """The job's final status, within ``args.timeout`` (then the job is stopped). ``--follow``
    prints the log as it grows through the job client's own tailing (a websocket), not by
    downloading the whole log again and again."""
    deadline = time.monotonic() + args.timeout
    if args.follow:
        import asyncio

        async def tail() -> None:
            async for chunk in client.tail_job_logs(job_id):
                shown = [line for line in chunk.rstrip("\n").splitlines() if not line.startswith(RUN_FILES_MARK)]
                if shown:
                    echo("\n".join(shown))

        try:
            asyncio.run(asyncio.wait_for(tail(), timeout=args.timeout))
        except (asyncio.TimeoutError, TimeoutError):
            pass  # the status loop below stops the job
    while True:
        status = str(client.get_job_status(job_id)).split(".")[-1]
        if status in _FINAL:
            return status
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise TransferError(f"ray job {job_id}: still running after {args.timeout:.0f}s; stopped")
        time.sleep(0.5)
