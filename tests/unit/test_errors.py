from __future__ import annotations

import pickle

import pytest

from conveyor import errors


@pytest.mark.parametrize("cls", [c for c in vars(errors).values()
                                 if isinstance(c, type) and issubclass(c, errors.ConveyorError) and c is not errors.JobFailed])
def test_every_error_pickles_with_its_hint(cls: type[errors.ConveyorError]) -> None:
    err = cls("something failed", hint="do this")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == "something failed" and back.hint == "do this"
    assert back.exit_code == cls.exit_code


def test_job_failed_speaks_for_its_cause_and_carries_the_report() -> None:
    cause = errors.SchemaError("postgres table public.t does not exist", hint="create it first")
    err = pickle.loads(pickle.dumps(errors.JobFailed(cause, report={"rows": 3})))
    assert (str(err), err.hint, err.exit_code) == (str(cause), "create it first", 4)
    assert type(err.cause) is errors.SchemaError and err.report == {"rows": 3}
    internal = errors.JobFailed(KeyError("x"))
    assert internal.exit_code == 1 and str(internal) == "KeyError: 'x'" and internal.report is None


def test_transfer_error_keeps_partition_and_retriable() -> None:
    err = pickle.loads(pickle.dumps(errors.TransferError("x", partition="p-1", retriable=True)))
    assert err.partition == "p-1" and err.retriable is True


def test_exit_codes_are_distinct_per_family() -> None:
    assert errors.ConfigError.exit_code == 2
    assert errors.ConnectError.exit_code == 3
    assert errors.SchemaError.exit_code == 4
    assert errors.TransferError.exit_code == 5
    assert errors.VerificationError.exit_code == 6


@pytest.mark.parametrize(("message", "state", "retriable"), [
    ("[libpq] Execution error [PGRES_FATAL_ERROR]: FATAL:  terminating connection due to administrator command", None, True),
    ("server closed the connection unexpectedly", None, True),
    ("deadlock detected", "40P01", True),
    ("could not serialize access", "40001", True),
    ('duplicate key value violates unique constraint "t_pkey"', "23505", False),
    ("invalid input syntax for type integer", "22P02", False),
])
def test_postgres_errors_split_retriable_from_fatal(message: str, state: str | None, retriable: bool) -> None:
    from conveyor.connectors.postgres.common import PgConnConfig, translate

    class DriverError(Exception):
        sqlstate = state

    err = translate(DriverError(message), PgConnConfig(), "reading", partition="p-1")
    assert isinstance(err, errors.TransferError) and err.retriable is retriable and err.partition == "p-1"


def test_a_local_permission_error_does_not_hint_at_aws() -> None:
    """Tests run as root, where the OS grants everything: the OS's own exception is built here."""
    from conveyor.kit.fs import translate

    local = translate(PermissionError(13, "Permission denied", "/data/x.parquet"), "sink.path '/data'")
    assert "access denied" in local.message and "permissions of that file or folder for user" in local.hint
    assert "AWS" not in local.hint
    remote = translate(PermissionError("Access Denied"), "sink.path 's3://b/x'")  # how s3fs raises it: no errno
    assert "AWS_ACCESS_KEY_ID" in remote.hint
    missing = translate(FileNotFoundError(2, "No such file or directory", "/nope"), "source.path '/nope'")
    assert missing.hint == "check the path"


def test_an_undefined_var_hints_at_vars_not_the_environment() -> None:
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.errors import ConfigError

    base = {"source": {"type": "parquet", "path": "a"}, "sink": {"type": "parquet", "path": "b"},
            "strategy": {"type": "files"}, "runtime": {"type": "local"}}
    with pytest.raises(ConfigError) as err:
        build_job(OmegaConf.create({**base, "vars": {}, "sink": {"type": "parquet", "path": "${vars.out}"}}))
    assert "vars.out" in err.value.message and err.value.hint.startswith("define it: vars.out=...")
    with pytest.raises(ConfigError) as err:
        build_job(OmegaConf.create({**base, "sink": {"type": "parquet", "path": "${oc.env:CONVEYOR_SURELY_UNSET}"}}))
    assert "CONVEYOR_SURELY_UNSET" in err.value.message and "environment variable" in err.value.hint
