"""docs/design/serving.md's table of the two tiers side by side is what the code computes."""

from pathlib import Path

import pytest

from perfcast.serving.agreement import markdown, table

DOC = Path(__file__).parent.parent / "docs" / "design" / "serving.md"


@pytest.fixture(scope="module")
def rows():
    return table()


def test_the_docs_agreement_table_is_recomputed_exactly(rows):
    assert markdown(rows) in DOC.read_text()


def test_the_tiers_agree_on_tpot_and_throughput_where_the_doc_says(rows):
    for r in rows:
        lock_step = r.lengths == "fixed" and "closed" in r.load
        if not lock_step:
            assert 0.85 <= r.tpot <= 1.15, r
        if not (lock_step and r.engine == "sglang"):
            assert 0.9 <= r.throughput <= 1.1, r
