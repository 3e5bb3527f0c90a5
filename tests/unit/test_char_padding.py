"""char(n) read by DuckDB (which trims the padding) gets it back column-wise: the byte-wise kernel where every value is
ASCII, the character-wise one otherwise; both give what PostgreSQL stores."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from conveyor.connectors.postgres.duckdecode import pad


def test_ascii_and_other_text_are_padded_to_n_characters() -> None:
    ascii_only = pa.array(["ab", None, "x\t", "", "abcd"])
    assert pad(ascii_only, 4).to_pylist() == ["ab  ", None, "x\t  ", "    ", "abcd"]
    assert pad(ascii_only, 4).equals(pc.utf8_rpad(ascii_only, width=4, padding=" "))
    wide = pa.array(["αβ", "é", None, "a"])  # two bytes a character: padded by characters, not bytes
    assert pad(wide, 3).to_pylist() == ["αβ ", "é  ", None, "a  "]
    assert pad(pa.array([None, None], pa.string()), 2).to_pylist() == [None, None]
    assert pad(pa.array([["a", None], None, ["é"]], pa.list_(pa.string())), 2).to_pylist() == [["a ", None], None, ["é "]]
