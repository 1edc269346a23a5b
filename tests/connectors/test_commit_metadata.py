"""connectors.delta_commit's commit metadata: a key written by either Delta writer is read
back from the commit's history row, wherever that writer keeps it."""

from __future__ import annotations

import json

from connectors.delta_commit import commit_token, commit_value


def test_a_key_is_found_in_either_writers_commit() -> None:
    delta_rs = {"operation": "MERGE", "view": "v1"}  # delta-rs: a key of the commit
    delta_spark = {"operation": "MERGE", "userMetadata": commit_token("run-1", {"view": "v2"})}
    assert commit_value(delta_rs, "view") == "v1"
    assert commit_value(delta_spark, "view") == "v2"
    assert json.loads(delta_spark["userMetadata"])["run"] == "run-1"


def test_a_commit_without_the_key_or_with_another_tools_metadata_has_none() -> None:
    assert commit_value({"operation": "WRITE"}, "view") is None
    assert commit_value({"userMetadata": commit_token("run-1")}, "view") is None
    assert commit_value({"userMetadata": "not json"}, "view") is None
    assert commit_value({"userMetadata": '["a list"]'}, "view") is None
    assert commit_value({"view": 3}, "view") is None  # not text: not ours
