import pytest

from llmrl.io import atomic_path, write_json


def test_atomic_file_and_dir(tmp_path):
    write_json(tmp_path / "m.json", {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "m.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert (tmp_path / "m.json").read_text().strip() == '{\n  "a": 1\n}'
    with atomic_path(tmp_path / "d", is_dir=True) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "d", is_dir=True) as tmp:
            (tmp / "x").write_text("2")
            raise RuntimeError("interrupted")
    assert (tmp_path / "d" / "x").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.json"]
