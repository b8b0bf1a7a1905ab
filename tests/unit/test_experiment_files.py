"""Experiment files of the wrong structure get a sentence naming the file,
the experiment, the field and the type expected (perfsuite.cells)."""

from __future__ import annotations

import pytest

from perfsuite import cells

GOOD = '''
[[experiment]]
name = "mine"
tier = "smoke"
workload = "image"
[experiment.fixed]
strategy = "ddp"
device = "cpu"
precision = "fp32"
pin_memory = false
dataset = "digits"
batch_size = 8
image_size = 32
[experiment.axes]
world_size = [1, 2]
'''


def load(tmp_path, text: str | bytes):
    path = tmp_path / "mine.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return cells.load_matrix([path])


def test_a_good_file_gives_its_cells(tmp_path):
    assert len(load(tmp_path, GOOD)) == 2


@pytest.mark.parametrize("change, says", [
    (("[[experiment]]", "[experiment]"), "write [[experiment]] for each experiment"),
    (("world_size = [1, 2]", "world_size = 2.5"), "experiment 'mine'.axes.world_size: is 2.5, expected array"),
    (("world_size = [1, 2]", "world_size = [2.5]"), "experiment 'mine'.axes.world_size.0: is 2.5, expected integer"),
    (("world_size = [1, 2]", "world_size = [true]"), "experiment 'mine'.axes.world_size.0: is True, expected integer"),
    (("world_size = [1, 2]", "world_size = []"), "experiment 'mine'.axes.world_size"),
    (("[experiment.fixed]", "[experiment.fixd]"), "experiment 'mine': unknown key(s) ['fixd']"),
    (("[experiment.axes]", "[experiment.axis]"), "experiment 'mine': unknown key(s) ['axis']"),
    (("batch_size = 8", "batch_size = 8\nbatchsize = 8"), "experiment 'mine'.fixed: unknown key(s) ['batchsize']"),
    (("pin_memory = false", 'pin_memory = "no"'), "experiment 'mine'.fixed.pin_memory: is 'no', expected boolean"),
    (("batch_size = 8", "batch_size = 8\nworld_size = 1"), "world_size is both fixed and on an axis"),
])
def test_a_file_of_the_wrong_structure_is_named_with_what_was_expected(tmp_path, change, says):
    old, new = change
    with pytest.raises(cells.CellError) as raised:
        load(tmp_path, GOOD.replace(old, new, 1))
    assert str(raised.value).startswith(f"{tmp_path / 'mine.toml'}: ") and says in str(raised.value)


def test_fixed_as_a_string_is_named(tmp_path):
    text = GOOD.split("[experiment.fixed]")[0] + 'fixed = "strategy=ddp"\n'
    with pytest.raises(cells.CellError, match=r"experiment 'mine'.fixed: is 'strategy=ddp', expected object"):
        load(tmp_path, text)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    with pytest.raises(cells.CellError, match="not UTF-8 text"):
        load(tmp_path, GOOD.encode() + b"# caf\xe9\n")


def test_the_suites_own_files_pass_the_schema():
    assert len(cells.load_matrix()) > 100
