"""Arrow Flight: a source that reads a FlightInfo's endpoints and a sink that writes with do_put.

Each endpoint of the flight is a partition (``strategy=native``), fetched with do_get from
the endpoint's own location when it names one. A shared token (``token_env`` names the
environment variable holding it) is sent as ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.core import (
    JobOptions,
    NativePartition,
    Partition,
    PrepareRequest,
    SinkBase,
    SinkCapabilities,
    SinkPlan,
    SourceBase,
    SourceInfo,
    TargetInfo,
    WholeSource,
    WriteStats,
)
from conveyor.errors import ConfigError, ConnectError, ConveyorError, PlanningError, SchemaError, TransferError, first_line


@dataclass
class FlightConfig:
    #: the Flight service, e.g. grpc://127.0.0.1:8815 (grpc+tls:// for TLS)
    location: str = "???"
    #: the flight descriptor's path
    path: list[str] = field(default_factory=lambda: ["data"])
    #: the environment variable holding a shared token, sent as a Bearer header
    token_env: str | None = None
    #: seconds each call may take before it fails
    timeout: float = 30.0


def call_options(conf: FlightConfig) -> Any:
    import pyarrow.flight as fl

    headers = []
    if conf.token_env:
        token = os.environ.get(conf.token_env)
        if token is None:
            raise ConfigError(f"token_env: the environment variable {conf.token_env} is not set", key="token_env")
        headers.append((b"authorization", b"Bearer " + token.encode()))
    return fl.FlightCallOptions(headers=headers, timeout=conf.timeout)


def translate(exc: BaseException, conf: FlightConfig, doing: str, partition: str | None = None) -> ConveyorError:
    import pyarrow.flight as fl

    if isinstance(exc, ConveyorError):
        return exc
    # a Python service's error comes with its own traceback and gRPC's context after it: the message alone
    text = re.split(r"\.?\s*(?:Traceback \(most recent call last\)|gRPC client debug context|Detail: Python exception|Client context:)",
                    first_line(exc))[0].strip()
    msg = f"flight {conf.location}: {doing}: {text}"
    if isinstance(exc, (fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError)):
        return ConnectError(msg, hint=f"check the token in ${conf.token_env}" if conf.token_env else "the service wants a token: set token_env")
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightTimedOutError)):
        if partition is None:
            return ConnectError(msg, hint="is the Flight service running at that location?")
        return TransferError(msg, partition=partition, retriable=True)
    if isinstance(exc, KeyError) or "not found" in text.lower() or "unknown" in text.lower():
        return SchemaError(msg, hint="check the flight path")
    return TransferError(msg, partition=partition)


class _Flight:
    config: FlightConfig

    def _client(self, location: str | None = None) -> Any:
        import pyarrow.flight as fl

        return fl.connect(location or self.config.location)

    def _descriptor(self) -> Any:
        import pyarrow.flight as fl

        return fl.FlightDescriptor.for_path(*self.config.path)


class FlightSource(SourceBase, _Flight):
    config_class = FlightConfig

    def __init__(self, config: FlightConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def _info(self) -> Any:
        client = self._client()
        try:
            return client.get_flight_info(self._descriptor(), call_options(self.config))
        except Exception as exc:
            raise translate(exc, self.config, f"get_flight_info {'/'.join(self.config.path)}") from None
        finally:
            client.close()

    def describe(self) -> SourceInfo:
        info = self._info()
        rows = info.total_records if info.total_records >= 0 else None
        return SourceInfo(schema=info.schema, label=f"flight {self.config.location} {'/'.join(self.config.path)}", estimated_rows=rows)

    def native_partitions(self) -> list[NativePartition]:
        endpoints = self._info().endpoints
        n = len(endpoints)
        return [NativePartition(index=i, count=n, token=ep.ticket.ticket, locations=tuple(loc.uri.decode() for loc in ep.locations),
                                label=f"endpoint {i + 1} of {n}") for i, ep in enumerate(endpoints)]

    def read(self, part: Partition) -> Iterator[Any]:
        if isinstance(part, NativePartition):
            yield from self._get(part.token, part.locations, part.key)
        elif isinstance(part, WholeSource):
            for ep in self.native_partitions():
                yield from self._get(ep.token, ep.locations, part.key)
        else:
            raise PlanningError(f"flight source cannot read a {part.kind} partition", hint="use strategy=native or none")

    def _get(self, token: bytes, locations: Sequence[str], key: str) -> Iterator[Any]:
        import pyarrow.flight as fl

        # an endpoint may name where to fetch it; "arrow-flight-reuse-connection://?" means here
        location = next((loc for loc in locations if not loc.startswith("arrow-flight-reuse-connection")), None)
        client = self._client(location)
        try:
            reader = client.do_get(fl.Ticket(token), call_options(self.config))
            for chunk in reader:
                yield chunk.data
        except ConveyorError:
            raise
        except Exception as exc:
            raise translate(exc, self.config, f"do_get {key}", key) from None
        finally:
            client.close()


class FlightSink(SinkBase, _Flight):
    """do_put of each partition's batches; what the service does with them is the service's.

    A do_put stream is not a transaction: a failed partition may have delivered part of its rows,
    so a Flight sink is never retried (a retry could duplicate them).
    """

    config_class = FlightConfig
    capabilities = SinkCapabilities(transactional=False)

    def __init__(self, config: FlightConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        return TargetInfo(label=f"flight {self.config.location} {'/'.join(self.config.path)}",
                          path="arrow: one do_put stream per partition (not a transaction: never retried)")

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        if self.options.load_mode != "append":
            raise SchemaError(f"flight sink: load_mode={self.options.load_mode} is not possible; a Flight service receives do_put streams",
                              hint="use load_mode=append")
        names = tuple(request.schema.names)
        return SinkPlan(target=f"flight {self.config.location} {'/'.join(self.config.path)}", write_target="/".join(self.config.path),
                        load_mode="append", columns=names, source_columns=names, schema=request.schema)

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        from conveyor.kit.arrowutil import cast_batches

        start, rows, nbytes = time.perf_counter(), 0, 0
        client = self._client()
        try:
            writer, _ = client.do_put(self._descriptor(), plan.schema, call_options(self.config))
            for batch in cast_batches(batches, plan.schema):
                writer.write_batch(batch)
                rows += batch.num_rows
                nbytes += batch.nbytes
            writer.close()
        except ConveyorError:
            raise
        except Exception as exc:
            raise translate(exc, self.config, f"do_put {part.key}", part.key) from None
        finally:
            client.close()
        return WriteStats(part.key, rows, nbytes, time.perf_counter() - start)

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        pass

    def abort(self, plan: SinkPlan) -> None:
        pass
