"""Configuration that could never judge, or never pass, is refused when it is
read, naming the file, the finding or experiment and what would be taken;
and the command line's own: an old and a new name of one option given
different values, a cell given twice, thousands of unknown ids, an error
under --json."""

from __future__ import annotations

import json

import pytest

from perfsuite import cells
from perfsuite.cli import main as cli

FINDING = ('[[finding]]\nname = "mine"\nsource = "s"\nsubject = {precision = "fp32", world_size = 2}\n'
           'twin = {precision = "fp64"}\nlow = 1.1\n')
EXPERIMENT = '[[experiment]]\nname = "mine"\ntier = "smoke"\nworkload = "mymodel.train:run"\n'
GPU_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"  # skipped without a launch (--allow-no-gpu)
NO_LAUNCH = ["--allow-no-gpu", "--no-probe", "--history", "off"]


def written(tmp_path, text: str):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


def refusal(tmp_path, text: str, load=cells.load_findings) -> str:
    path = written(tmp_path, text)
    with pytest.raises(cells.CellError) as raised:
        load([path])
    said = str(raised.value)
    assert said.startswith(f"{path}: "), said
    return said


def test_a_good_finding_of_ones_own_is_read(tmp_path):
    (finding,) = cells.load_findings([written(tmp_path, FINDING)])
    assert finding.name == "mine" and finding.twin == {"precision": "fp64"}


@pytest.mark.parametrize("change, says", [
    (("low = 1.1", "low = 1.1\ndevices = []"), ["finding 'mine'.devices", "no device", "cpu, cuda"]),
    (('twin = {precision = "fp64"}', 'twin = {precision = "fp32"}'), ["finding 'mine'.twin", "its subject"]),
    (('twin = {precision = "fp64"}', "twin = {}"), ["finding 'mine'.twin", "its subject"]),
    (('twin = {precision = "fp64"}', 'twin = {precision = "fp128"}'),
     ["finding 'mine'.twin.precision", "'fp128'", "fp64, fp32, fp16, bf16"]),
    (('subject = {precision = "fp32", world_size = 2}', 'subject = {device = "gpu"}'),
     ["finding 'mine'.subject.device", "'gpu'", "cpu, cuda"]),
    (('twin = {precision = "fp64"}', 'twin = {strategy = "ddq"}'), ["finding 'mine'.twin.strategy", "'ddq'", "ddp-ds"]),
    (("low = 1.1", "low = -5\nhigh = 0"), ["finding 'mine'", "high 0", "never pass", "above 0"]),
    (("low = 1.1", "high = -1.0"), ["finding 'mine'", "high -1.0", "never pass"]),
    (("low = 1.1", "low = 1.5\nhigh = 1.5"), ["finding 'mine'", "low 1.5", "below high"]),
    (('name = "mine"', 'name = "fp32-faster-than-fp64"'),
     ["finding 'fp32-faster-than-fp64'", "built-in", "image.toml", "another name"]),
])
def test_a_finding_that_can_never_judge_or_never_pass_is_refused_naming_file_and_finding(tmp_path, change, says):
    said = refusal(tmp_path, FINDING.replace(*change, 1))
    missing = [s for s in says if s not in said]
    assert not missing, (missing, said)


def test_a_finding_given_twice_in_ones_files_is_refused(tmp_path):
    said = refusal(tmp_path, FINDING + FINDING.replace("low = 1.1", "low = 1.2"))
    assert "finding 'mine'" in said and "twice" in said


def test_an_experiment_reusing_a_built_in_name_is_refused(tmp_path):
    said = refusal(tmp_path, EXPERIMENT.replace('"mine"', '"smoke-ddp"'), load=cells.load_matrix)
    assert "experiment 'smoke-ddp'" in said and "built-in" in said and "image.toml" in said


@pytest.mark.parametrize("table, meant", [("experiments", "experiment"), ("findings", "finding"),
                                          ("default", "defaults")])
def test_a_misspelt_table_name_is_refused_with_the_name_meant(tmp_path, table, meant):
    text = (EXPERIMENT if meant != "finding" else FINDING).replace("[[experiment]]", f"[[{table}]]").replace(
        "[[finding]]", f"[[{table}]]")
    if meant == "defaults":
        text = EXPERIMENT + '[default.smoke.image]\nbatch_size = 8\n'
    said = refusal(tmp_path, text, load=cells.load_matrix)
    assert f"[{table}" in said or f"'{table}'" in said
    assert f"did you mean {meant!r}" in said or f"did you mean [[{meant}]]" in said or \
        f"did you mean [{meant}]" in said, said


def test_an_experiments_folder_without_toml_files_is_refused(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.tml").write_text(EXPERIMENT)
    monkeypatch.setenv("PERFSUITE_EXPERIMENTS", str(tmp_path / "exp"))
    with pytest.raises(cells.CellError) as raised:
        cells.experiment_paths()
    assert str(tmp_path / "exp") in str(raised.value) and "no *.toml" in str(raised.value)


def test_a_cell_given_twice_is_measured_once_and_said(tmp_path, capsys):
    code = cli.main(["run", GPU_CELL, GPU_CELL, "--out", str(tmp_path / "out"), *NO_LAUNCH])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "[1/1]" in said.out and "[2/2]" not in said.out
    assert f"{GPU_CELL} is given twice" in said.out + said.err


def test_thousands_of_unknown_ids_are_named_in_one_short_line():
    wanted = [f"smoke/image/nosuch/c{i}" for i in range(5000)]
    with pytest.raises(cells.CellError) as raised:
        cells.select(ids=wanted)
    said = str(raised.value)
    assert len(said) < 600, len(said)
    assert wanted[0] in said and "and 4995 more" in said and "perfsuite list" in said


def test_a_cell_id_given_twice_is_one_cell():
    ids = [GPU_CELL, GPU_CELL.replace("g2", "g1"), GPU_CELL]
    assert [c.id for c in cells.select(ids=ids)] == ids[:2]


@pytest.mark.parametrize("argv, names", [
    (["--profile", "nsys", "--profiler", "torch"], ["--profile", "--profiler", "nsys", "torch"]),
    (["--profiler", "torch", "--profile", "nsys"], ["--profile", "--profiler", "nsys", "torch"]),
])
def test_an_old_and_a_new_option_name_given_different_values_are_refused(tmp_path, capsys, argv, names):
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), *NO_LAUNCH, *argv])
    said = capsys.readouterr().err
    assert stop.value.code == 2 and all(n in said for n in names), said
    assert not (tmp_path / "out").exists()


def test_an_old_and_a_new_name_of_the_history_store_are_refused_where_they_differ(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["history", "show", GPU_CELL, "--url", str(tmp_path / "a.sqlite"),
                  "--history", str(tmp_path / "b.sqlite")])
    said = capsys.readouterr().err
    assert stop.value.code == 2 and "--url" in said and "--history" in said, said
    assert list(tmp_path.iterdir()) == []


def test_an_old_and_a_new_option_name_given_one_value_are_taken(tmp_path, capsys):
    code = cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), *NO_LAUNCH, "--profile", "off",
                     "--profiler", "off"])
    assert code == 0 and "--profile is now --profiler" in capsys.readouterr().err


@pytest.mark.parametrize("argv, names", [
    (["run", "smoke/image/nosuch/c1", "--json"], ["smoke/image/nosuch/c1"]),
    (["run", "--json"], ["--tier"]),
    (["compare", "{t}/a", "{t}/b", "--json"], ["{t}/a"]),
    (["run", GPU_CELL, "--json", "--history", "OFF", "--allow-no-gpu"], ["OFF"]),
])
def test_json_prints_one_object_on_an_error_too(tmp_path, capsys, monkeypatch, argv, names):
    monkeypatch.chdir(tmp_path)
    code = cli.main([a.replace("{t}", str(tmp_path)) for a in argv])
    said = capsys.readouterr()
    document = json.loads(said.out)
    assert code == 2 and document["exit_code"] == 2
    assert all(n.replace("{t}", str(tmp_path)) in document["error"] for n in names), document


def test_json_prints_one_object_on_a_command_line_error(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", GPU_CELL, "--json", "--repeats", "x"])
    document = json.loads(capsys.readouterr().out)
    assert stop.value.code == 2 and document["exit_code"] == 2 and "--repeats" in document["error"]


@pytest.mark.parametrize("value", ["OFF", "Off"])
def test_a_history_store_named_off_in_other_case_is_refused(tmp_path, capsys, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--allow-no-gpu", "--no-probe",
                     "--history", value])
    said = capsys.readouterr().err
    assert code == 2 and f"--history {value}" in said and "off" in said and "./" in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == []
