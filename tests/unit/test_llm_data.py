"""Generated LLM datasets: schemas, determinism, lengths; the shipped tokenizer."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perfsuite.workloads import llm_data, llm_tokenizer

COLUMNS = {
    "alpaca": {"instruction", "input", "output"},
    "samsum": {"id", "dialogue", "summary"},
    "grammar": {"input", "output"},
    "slimorca": {"conversations"},
    "stack_exchange_paired": {"qid", "question", "response_j", "response_k"},
}


@pytest.fixture(scope="module")
def tokenizer():
    from torchtune.models.llama3 import llama3_tokenizer

    return llama3_tokenizer(str(llm_tokenizer.TOKENIZER_FILE),
                            special_tokens_path=str(llm_tokenizer.SPECIAL_TOKENS_FILE))


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_rows_have_the_dataset_schema(name):
    rows = llm_data.generate_rows(name, 50)
    assert all(set(row) == COLUMNS[name] for row in rows)
    if name == "slimorca":
        for row in rows:
            roles = [turn["from"] for turn in row["conversations"]]
            assert roles[-2:] == ["human", "gpt"] and set(roles) <= {"system", "human", "gpt"}
    if name == "grammar":
        assert sum(r["input"] != r["output"] for r in rows) > 40  # errors were put in


def test_generation_is_deterministic():
    assert llm_data.generate_rows("samsum", 20) == llm_data.generate_rows("samsum", 20)
    assert llm_data.generate_rows("samsum", 20) != llm_data.generate_rows("samsum", 20, seed=1)


def test_alpaca_inputs_are_often_empty():
    rows = llm_data.generate_rows("alpaca", 400)
    assert 0.45 < sum(r["input"] == "" for r in rows) / len(rows) < 0.75


def test_mean_tokens_follow_the_real_datasets_order(tokenizer):
    """slimorca > alpaca > samsum > grammar, as the paper's Fig. 4 iteration times."""
    def mean_tokens(name):
        rows = llm_data.generate_rows(name, 300, seed=3)
        return statistics.mean(
            len(tokenizer.encode(llm_data.TEXT_COLUMNS[name](r), add_bos=False, add_eos=False))
            for r in rows)

    means = {name: mean_tokens(name) for name in ("slimorca", "alpaca", "samsum", "grammar")}
    assert means["slimorca"] > means["alpaca"] > means["samsum"] > means["grammar"]
    assert means["grammar"] < 0.5 * means["samsum"]


def test_generated_file_is_written_once(tmp_path):
    path = llm_data.generated_file("grammar", 30, tmp_path)
    first = path.read_bytes()
    assert len(first.splitlines()) == 30
    assert json.loads(first.splitlines()[0]).keys() == {"input", "output"}
    assert llm_data.generated_file("grammar", 30, tmp_path).read_bytes() == first


def test_source_without_user_data_is_generated(tmp_path):
    section, origin = llm_data.dataset_source("samsum", None, 10, tmp_path)
    assert section["_component_"] == "torchtune.datasets.samsum_dataset"
    assert section["source"] == "json" and section["split"] == "train"
    assert "generated" in origin
    assert len(Path(section["data_files"]).read_text().splitlines()) == \
        llm_data.DEFAULT_GENERATED_ROWS


def test_user_data_file_or_directory_is_used(tmp_path):
    (tmp_path / "alpaca.jsonl").write_text('{"instruction": "a", "input": "", "output": "b"}\n')
    section, _ = llm_data.dataset_source("alpaca", str(tmp_path), 10, tmp_path)
    assert section["data_files"] == str(tmp_path / "alpaca.jsonl")
    (tmp_path / "Open-Orca" / "SlimOrca-Dedup").mkdir(parents=True)
    section, _ = llm_data.dataset_source("slimorca", str(tmp_path), 10, tmp_path)
    assert section["source"] == str(tmp_path / "Open-Orca" / "SlimOrca-Dedup")


def test_missing_user_data_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        llm_data.dataset_source("samsum", str(tmp_path), 10, tmp_path)
    assert "samsum.jsonl" in str(err.value) and "Samsung/samsum" in str(err.value)


def test_rows_needed():
    assert llm_data.rows_needed(5, 2, 4, 1, "alpaca") == 40
    assert llm_data.rows_needed(0, 2, 1, 1, "alpaca") == 51_760
    with pytest.raises(ValueError, match="grammar"):
        llm_data.rows_needed(0, 2, 1, 1, "grammar")


def test_tokenizer_round_trip_and_special_ids(tokenizer):
    text = "Summarize: Anna met 1234 friends\r\n at the café — naïve 日本!"
    ids = tokenizer.encode(text, add_bos=True, add_eos=True)
    assert tokenizer.decode(ids) == text
    assert max(ids) < llm_tokenizer.VOCAB_LIMIT
    specials = [tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.eot_id]
    assert all(llm_tokenizer.VOCAB_LIMIT - 256 <= i < llm_tokenizer.VOCAB_LIMIT
               for i in specials)
    assert llm_tokenizer.vocab_size() == llm_tokenizer.VOCAB_LIMIT


def test_bpe_training_is_deterministic():
    text = "the cat sat on the mat. the cat ate the rat." * 20
    ranks = llm_tokenizer.train_bpe(text, 10)
    assert ranks == llm_tokenizer.train_bpe(text, 10)
    assert len(ranks) == 266 and b" the" in ranks


def test_dpo_pairs_carry_the_tokens_of_their_text(tokenizer):
    """Chosen and rejected answers tokenise alike, and as densely as the SFT rows.

    A DPO step trains on question + chosen and question + rejected; the paper's
    technique comparison (QAT slowest per iteration) reads step times, so the
    generated pairs must not carry more tokens than text of their length does.
    Rejected answers in capitals tokenised at ~1.3 characters per token
    against ~4 (~3x the chosen answer's tokens, ~1.5x a whole pair's).
    """
    def tokens(text):
        return len(tokenizer.encode(text, add_bos=False, add_eos=False))

    rows = llm_data.generate_rows("stack_exchange_paired", 120, seed=3)
    chosen = sum(tokens(r["response_j"]) for r in rows)
    rejected = sum(tokens(r["response_k"]) for r in rows)
    assert 1 / 1.5 < rejected / chosen < 1.5, (chosen, rejected)
    assert all(r["response_k"] != r["response_k"].upper() for r in rows)

    def chars_per_token(texts):
        return sum(map(len, texts)) / sum(map(tokens, texts))

    sft = chars_per_token([llm_data.TEXT_COLUMNS["alpaca"](r)
                           for r in llm_data.generate_rows("alpaca", 120, seed=3)])
    for key in ("question", "response_j", "response_k"):
        density = chars_per_token([r[key] for r in rows])
        assert 1 / 1.25 < density / sft < 1.25, (key, density, sft)


def test_dpo_preference_is_in_the_words():
    """The learnable preference (a smoke DPO run's loss falls): chosen and
    rejected answers draw their words from disjoint halves of the vocabulary."""
    def words(text):
        return {w.strip(".?").lower() for w in text.split() if not w.strip(".?").isdigit()}

    rows = llm_data.generate_rows("stack_exchange_paired", 60)
    chosen = set().union(*(words(r["response_j"]) for r in rows))
    rejected = set().union(*(words(r["response_k"]) for r in rows))
    assert chosen and rejected and not chosen & rejected


# ------------------------------------------------ where the cache lives
@pytest.fixture
def clean_cache_env(tmp_path, monkeypatch):
    """HOME and the working directory in tmp_path, no cache variable set."""
    for name in ("PERFSUITE_CACHE_DIR", "PERFSUITE_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    return tmp_path


def cache_of(options=None):
    from perfsuite.context import RankContext

    return RankContext(0, 1, 0, "cpu", Path("out"), options=dict(options or {})).cache_dir


def test_cache_defaults_outside_the_checkout(clean_cache_env, monkeypatch):
    """The generated data and the 16 GB random 8B checkpoint outlive a CI
    checkout, which cleans the workspace: the user's cache, not the cwd."""
    tmp = clean_cache_env
    assert cache_of() == tmp / "home" / ".cache" / "perfsuite"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "xdg"))
    assert cache_of() == tmp / "xdg" / "perfsuite"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    assert cache_of() == tmp / "home" / ".cache" / "perfsuite"


@pytest.mark.parametrize("variable", ["PERFSUITE_CACHE", "PERFSUITE_CACHE_DIR"])
def test_cache_variable_and_option_win(clean_cache_env, monkeypatch, variable):
    from perfsuite.context import default_cache_dir

    tmp = clean_cache_env
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "xdg"))
    monkeypatch.setenv(variable, str(tmp / "runner-cache"))
    assert cache_of() == default_cache_dir() == tmp / "runner-cache"
    assert cache_of({"cache_dir": str(tmp / "option")}) == tmp / "option"
