"""Words of the report that a reader acts on (harness/analysis/report.py)."""

from harness.analysis import report


def test_epochs_are_written_as_a_reader_counts_them():
    # a few epochs keep their fraction; many (a tiny training set seen over and over) are whole
    assert report._epochs(0.25) == "0.25"
    assert report._epochs(3.75) == "3.75"
    assert report._epochs(80.0) == "80"
    assert report._epochs(239.6) == "240"
