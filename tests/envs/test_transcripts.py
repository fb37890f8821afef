"""Episodes stay what they were: transcripts recorded before reset cached tasks (issue #16) still match."""

from __future__ import annotations

import json

from tests.envs.transcripts import FIXTURE, record_all


def test_transcripts_match_the_fixture() -> None:
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))
    actual = json.loads(json.dumps(record_all()))  # the fixture's JSON form: tuples become lists
    assert set(actual) == set(expected) and all(len(rows) >= 2 for rows in expected.values())
    for key, rows in expected.items():
        got = actual[key]
        for i, (want, have) in enumerate(zip(rows, got)):
            assert have == want, f"{key}: step {i} differs (action {want[0]!r})"
        assert len(got) == len(rows), f"{key}: {len(got)} steps, the fixture has {len(rows)}"
