from __future__ import annotations

import pickle

import pytest

from conveyor import errors


@pytest.mark.parametrize("cls", [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ConveyorError)])
def test_every_error_pickles_with_its_hint(cls: type[errors.ConveyorError]) -> None:
    err = cls("something failed", hint="do this")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == "something failed" and back.hint == "do this"
    assert back.exit_code == cls.exit_code


def test_transfer_error_keeps_partition_and_retriable() -> None:
    err = pickle.loads(pickle.dumps(errors.TransferError("x", partition="p-1", retriable=True)))
    assert err.partition == "p-1" and err.retriable is True


def test_exit_codes_are_distinct_per_family() -> None:
    assert errors.ConfigError.exit_code == 2
    assert errors.ConnectError.exit_code == 3
    assert errors.SchemaError.exit_code == 4
    assert errors.TransferError.exit_code == 5
    assert errors.VerificationError.exit_code == 6
