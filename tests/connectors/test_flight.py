"""Arrow Flight on loopback: `conveyor serve` as a real server process, and a minimal pyarrow.flight server."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConnectError, SchemaError
from conveyor.testing.pgserver import free_port
from tests.helpers import BIN, job

TOKEN = "flight-test-token-1234"


@pytest.fixture(scope="module")
def served(tpch_orders: Path):
    """`conveyor serve` of TPC-H orders (4 files: 4 endpoints), token required."""
    port = free_port()
    env = {**os.environ, "CONVEYOR_FLIGHT_TOKEN": TOKEN}
    proc = subprocess.Popen([str(BIN / "conveyor"), "serve", "--port", str(port), "--token-env", "CONVEYOR_FLIGHT_TOKEN",
                             "--name", "orders", "source=parquet", f"source.path={tpch_orders}", "strategy=files"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"conveyor serve did not start: {proc.stderr.read() if proc.stderr else ''}") from None
            time.sleep(0.2)
    yield f"grpc://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def _flight(location: str, **kw) -> dict:
    return {"type": "flight", "location": location, "path": ["orders"], "token_env": "CONVEYOR_FLIGHT_TOKEN", **kw}


def test_a_conveyor_pulls_every_endpoint_in_parallel(served: str, tpch_orders: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONVEYOR_FLIGHT_TOKEN", TOKEN)
    report = job(_flight(served), {"type": "parquet", "path": str(tmp_path / "out")}, "native", load_mode="create", degree=2)
    assert len(report.results) == 4 and report.rows == 15000
    back, orig = pq.read_table(tmp_path / "out"), pq.read_table(tpch_orders)
    assert sorted(back.column("o_orderkey").to_pylist()) == sorted(orig.column("o_orderkey").to_pylist())
    assert sorted(back.column("o_comment").to_pylist()) == sorted(orig.column("o_comment").to_pylist())


def test_plain_pyarrow_client_sees_the_endpoints(served: str) -> None:
    client = fl.connect(served)
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    info = client.get_flight_info(fl.FlightDescriptor.for_path("orders"), options)
    assert len(info.endpoints) == 4 and info.total_records == 15000
    assert client.do_get(info.endpoints[0].ticket, options).read_all().num_rows == 3750


def test_wrong_token(served: str, cli, tmp_path: Path) -> None:
    res = cli("run", "runtime=local", "source=flight", f"source.location={served}", "source.path=[orders]",
              "source.token_env=CONVEYOR_FLIGHT_TOKEN", "strategy=native", "sink=parquet", f"sink.path={tmp_path}/o",
              env={"CONVEYOR_FLIGHT_TOKEN": "wrong"})
    assert res.code == 3, res.err
    assert "a valid token is required" in res.err and "hint: check the token in $CONVEYOR_FLIGHT_TOKEN" in res.err
    assert "Traceback" not in res.err and TOKEN not in res.err


def test_unreachable_location(cli, tmp_path: Path) -> None:
    start = time.monotonic()
    res = cli("run", "runtime=local", "source=flight", f"source.location=grpc://127.0.0.1:{free_port()}", "source.timeout=5",
              "strategy=native", "sink=parquet", f"sink.path={tmp_path}/o")
    assert res.code == 3 and "error: flight grpc://127.0.0.1:" in res.err and "Traceback" not in res.err
    assert time.monotonic() - start < 60


# --- a minimal Flight server in this process: do_put stores, do_get serves ----------------------


class Store(fl.FlightServerBase):
    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables: dict[str, list[pa.Table]] = {}

    def do_put(self, context, descriptor, reader, writer):
        self.tables.setdefault(descriptor.path[0].decode(), []).append(reader.read_all())

    def get_flight_info(self, context, descriptor):
        name = descriptor.path[0].decode()
        parts = self.tables[name]
        endpoints = [fl.FlightEndpoint(f"{name}/{i}".encode(), []) for i in range(len(parts))]
        return fl.FlightInfo(parts[0].schema, descriptor, endpoints, sum(t.num_rows for t in parts), -1)

    def do_get(self, context, ticket):
        name, i = ticket.ticket.decode().split("/")
        return fl.RecordBatchStream(self.tables[name][int(i)])


@pytest.fixture
def store():
    server = Store()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_flight_sink_and_source_round_trip(store: Store, tpch_orders: Path, tmp_path: Path) -> None:
    location = f"grpc://127.0.0.1:{store.port}"
    report = job({"type": "parquet", "path": str(tpch_orders)}, {"type": "flight", "location": location, "path": ["orders"]},
                 "files", load_mode="append", degree=2)
    assert report.rows == 15000 and len(store.tables["orders"]) == 4
    back = job({"type": "flight", "location": location, "path": ["orders"]}, {"type": "parquet", "path": str(tmp_path / "b")},
               "native", load_mode="create", degree=2)
    assert back.rows == 15000
    assert sorted(pq.read_table(tmp_path / "b").column("o_orderkey").to_pylist()) == sorted(pq.read_table(tpch_orders).column("o_orderkey").to_pylist())


def test_flight_sink_only_appends(store: Store, tpch_orders: Path) -> None:
    with pytest.raises(SchemaError, match="load_mode=replace is not possible"):
        job({"type": "parquet", "path": str(tpch_orders)}, {"type": "flight", "location": f"grpc://127.0.0.1:{store.port}"},
            load_mode="replace")


def test_unknown_flight_path(store: Store, tmp_path: Path) -> None:
    with pytest.raises((SchemaError, ConnectError)):
        job({"type": "flight", "location": f"grpc://127.0.0.1:{store.port}", "path": ["nope"]},
            {"type": "parquet", "path": str(tmp_path / "o")}, "native", load_mode="create")


def test_the_flight_source_passes_the_connector_contract(conveyor_contract, served: str, monkeypatch) -> None:
    """The contract kit on the Flight source: its endpoints (strategy=native) and one whole read
    cover the served rows exactly once, everything pickles, and a ticket the server does not know
    fails as one of Conveyor's errors. (The Flight sink is not transactional - a do_put stream
    cannot be rolled back - so check_sink, which demands that, does not apply to it.)"""
    from conveyor.connectors.flight import FlightConfig, FlightSource
    from conveyor.core import NativePartition

    monkeypatch.setenv("CONVEYOR_FLIGHT_TOKEN", TOKEN)
    config = FlightConfig(**{k: v for k, v in _flight(served).items() if k != "type"})
    source = FlightSource(config, conveyor_contract.options)
    plans = conveyor_contract.check_source(source, {"native": {}})
    assert len(plans["native"]) == 4
    bogus = NativePartition(index=0, count=1, token=b"no such ticket", locations=(served,))
    err = conveyor_contract.check_read_error(source, bogus)
    assert "flight" in err.message.lower()


def test_a_flight_path_typo_is_one_line_without_the_services_traceback(served: str, cli, tmp_path: Path) -> None:
    """A Python Flight service's error carries its traceback: the one line ended with 'Traceback (most recent call last):'."""
    res = cli("run", "runtime=local", "source=flight", f"source.location={served}", "source.path=[ordrs]",
              "source.token_env=CONVEYOR_FLIGHT_TOKEN", "strategy=native", "sink=parquet", f"sink.path={tmp_path}/o",
              env={"CONVEYOR_FLIGHT_TOKEN": TOKEN})
    assert res.code == 4, res.err
    assert res.error_lines and "ordrs" in res.error_lines[0] and "Traceback" not in res.err and "hint: check the flight path" in res.err
