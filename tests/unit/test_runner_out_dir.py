"""The default output folder of a run (perfsuite.runner.default_out_dir)."""

from perfsuite.runner import default_out_dir


def test_two_runs_of_one_process_in_one_second_get_two_folders(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt: "20261125-120000")
    first = default_out_dir(tmp_path)
    first.mkdir(parents=True)
    second = default_out_dir(tmp_path)
    assert second != first and second.name == f"{first.name}-2"
    second.mkdir()
    assert default_out_dir(tmp_path).name == f"{first.name}-3"
