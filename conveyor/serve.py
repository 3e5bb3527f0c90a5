"""``conveyor serve``: any configured source as an Arrow Flight service.

The source is planned with the configured strategy and degree; the flight (one descriptor
path, ``--name``) has one endpoint per partition, so Flight clients, or another Conveyor with
``source=flight strategy=native``, pull the partitions in parallel. The server binds to
127.0.0.1 unless told otherwise; ``--token-env VAR`` requires ``authorization: Bearer
<$VAR>`` on every call.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError


@dataclass
class ServeArgs:
    overrides: list[str]
    host: str = "127.0.0.1"
    port: int = 8815
    name: str = "data"
    token_env: str | None = None


def _token_middleware(token: str) -> Any:
    import pyarrow.flight as fl

    expected = f"Bearer {token}"

    class _Check(fl.ServerMiddlewareFactory):
        def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
            given = headers.get("authorization") or headers.get("Authorization") or []
            if not any(secrets.compare_digest(g, expected) for g in given):
                raise fl.FlightUnauthenticatedError("a valid token is required")
            return None

    return _Check()


def make_server(source: Any, partitions: list[Any], schema: Any, args: ServeArgs, token: str | None) -> Any:
    import pyarrow.flight as fl

    from conveyor.kit.arrowutil import cast_batches

    location = f"grpc://{args.host}:{args.port}"

    class ConveyorFlightServer(fl.FlightServerBase):
        def _info(self) -> Any:
            descriptor = fl.FlightDescriptor.for_path(args.name)
            endpoints = [fl.FlightEndpoint(str(p.index).encode(), [self.location]) for p in partitions]
            rows = sum(p.estimated_rows for p in partitions) if all(p.estimated_rows is not None for p in partitions) else -1
            return fl.FlightInfo(schema, descriptor, endpoints, rows, -1)

        def list_flights(self, context: Any, criteria: bytes) -> Any:
            yield self._info()

        def get_flight_info(self, context: Any, descriptor: Any) -> Any:
            if [p.decode() if isinstance(p, bytes) else p for p in descriptor.path] != [args.name]:
                raise KeyError(f"unknown flight {descriptor.path!r}; this service serves [{args.name!r}]")
            return self._info()

        def do_get(self, context: Any, ticket: Any) -> Any:
            index = int(ticket.ticket.decode())
            if not 0 <= index < len(partitions):
                raise KeyError(f"unknown ticket {index}")
            return fl.GeneratorStream(schema, cast_batches(source.read(partitions[index]), schema))

    middleware = {"auth": _token_middleware(token)} if token else {}
    server = ConveyorFlightServer(location, middleware=middleware)
    server.location = fl.Location(f"grpc://{args.host}:{server.port}")
    return server


def serve(args: ServeArgs, echo: Any = print) -> int:
    from conveyor.config import build_job
    from conveyor.pipelines.plan import opened
    from conveyor.submit import compose

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ConfigError(f"--token-env: the environment variable {args.token_env} is not set or empty")
    spec = build_job(compose(args.overrides), kinds=("source", "strategy"))
    with opened(spec) as (plan, source):  # planned inside the snapshot every endpoint reads
        info, partitions = plan.info, plan.partitions
        server = make_server(source, partitions, info.schema, args, token)
        echo(f"serving {info.label} at grpc://{args.host}:{server.port} as flight [{args.name!r}]: "
             f"{len(partitions)} endpoint(s){', token required' if token else ''}", flush=True)
        server.serve()
    return 0
