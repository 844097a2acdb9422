
import locations
import pytest

from normx.data import glue as data
from normx.errors import InvalidInputError

SHARED = locations.SHARED
needs_data = pytest.mark.skipif(not (SHARED / "sst2").is_dir(), reason="the shared GLUE data folder is not here")


def test_tsv_rows_with_extra_fields_are_read_from_the_end(tmp_path):
    folder = tmp_path / "stsb"
    folder.mkdir()
    header = "index\tgenre\tsentence1\tsentence2\tscore"
    (folder / "dev.tsv").write_text(
        f"{header}\n0\tnews\tA \"quoted\" one.\tSecond.\t3.5\n1\tnews\textra\tfield\tFirst.\tOther.\t1.25\n")
    rows = data.load("stsb", "dev", tmp_path)
    assert rows == [data.Example('A "quoted" one.', "Second.", 3.5), data.Example("First.", "Other.", 1.25)]


def test_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown task"):
        data.load("cola", "dev", tmp_path)
    with pytest.raises(InvalidInputError, match="unknown split"):
        data.load("sst2", "test", tmp_path)
    with pytest.raises(InvalidInputError, match="missing"):
        data.load("sst2", "dev", tmp_path)
    with pytest.raises(InvalidInputError, match="does not exist"):
        data.load("sst2", "dev", tmp_path / "nope")


@needs_data
def test_real_sets_have_the_documented_sizes(monkeypatch):
    monkeypatch.setenv(data.ENV, str(SHARED))
    sizes = {(t, s): len(data.load(t, s)) for t in data.TASKS for s in data.SPLITS}
    assert sizes[("sst2", "train")] == 67349 and sizes[("sst2", "dev")] == 872
    assert sizes[("stsb", "train")] == 5749 and sizes[("stsb", "dev")] == 1500
    assert sizes[("mnli", "train")] + sizes[("mnli", "dev")] == 9815
    assert sizes[("qnli", "train")] + sizes[("qnli", "dev")] == 5463
    train, dev = data.load("mnli", "train"), data.load("mnli", "dev")
    assert not {(e.text, e.pair) for e in train} & {(e.text, e.pair) for e in dev}  # disjoint, seeded
    assert train == data.load("mnli", "train")
    assert {e.label for e in dev} == {0, 1, 2}
    assert all(0.0 <= e.label <= 5.0 for e in data.load("stsb", "dev"))
