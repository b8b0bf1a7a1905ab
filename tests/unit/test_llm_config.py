"""Recipe choice and the YAML config each LLM technique runs with."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from perfsuite.cells import Cell
from perfsuite.workloads import llm_config


def llm_cell(**changes) -> Cell:
    params = {"tier": "smoke", "workload": "llm", "strategy": "lora", "device": "cpu",
              "world_size": 1, "precision": "fp32", "pin_memory": False, "dataset": "alpaca",
              "batch_size": 2, "max_steps": 8, "warmup_steps": 2, "lr": 3e-4,
              "lr_warmup_steps": 100, "max_seq_len": 256}
    params.update(changes)
    return Cell(**params)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("llm-cache")


def plan_of(cell, tmp_path, cache, options=None, rank=0):
    return llm_config.build_plan(cell, rank, cell.world_size, tmp_path, options or {}, cache)


@pytest.mark.parametrize("technique, world, recipe", [
    ("lora", 1, "lora_finetune_single_device"), ("lora", 2, "lora_finetune_distributed"),
    ("qlora", 1, "lora_finetune_single_device"), ("qlora", 4, "lora_finetune_distributed"),
    ("dpo", 1, "lora_dpo_single_device"), ("dpo", 2, "lora_dpo_distributed"),
    ("qat", 1, "qat_distributed"), ("qat", 2, "qat_distributed"),
    ("qat-lora", 1, "qat_lora_finetune_distributed"),
    ("qat-lora", 3, "qat_lora_finetune_distributed"),
])
def test_recipe_choice(technique, world, recipe):
    assert llm_config.choose_recipe(technique, world).recipe == recipe
    assert (llm_config.recipes_dir() / f"{recipe}.py").is_file()


@pytest.mark.parametrize("technique", ["lora", "qlora", "dpo", "qat", "qat-lora"])
@pytest.mark.parametrize("world", [1, 2])
def test_config_carries_the_cell(technique, world, tmp_path, cache):
    dataset = "stack_exchange_paired" if technique == "dpo" else "alpaca"
    cell = llm_cell(strategy=technique, world_size=world, dataset=dataset)
    plan = plan_of(cell, tmp_path, cache, rank=world - 1)
    cfg = plan.config
    assert cfg["batch_size"] == 2 and cfg["epochs"] == 1 and cfg["max_steps_per_epoch"] == 8
    assert cfg["gradient_accumulation_steps"] == 1 and cfg["seed"] == 0
    assert cfg["optimizer"]["lr"] == 3e-4 and cfg["optimizer"]["fused"] is False
    assert cfg["device"] == "cpu" and cfg["dtype"] == "fp32" and cfg["compile"] is False
    assert cfg["log_every_n_steps"] == 1 and cfg["log_peak_memory_stats"] is False
    assert cfg["metric_logger"] == {"_component_": "perfsuite.workloads.llm_watch.StepLogger",
                                    "path": str(tmp_path / f"llm-steps-rank{world - 1}.jsonl"),
                                    "total_steps": cell.max_steps * cell.epochs}
    assert cfg["tokenizer"]["max_seq_len"] == 256
    assert cfg["dataset"]["source"] == "json"
    assert cfg["checkpointer"]["_component_"].endswith("SkipSaveTorchTuneCheckpointer")
    model = cfg["model"]
    if technique == "qat":
        assert model["_component_"] == "torchtune.models.llama3.llama3"
        assert "lora_rank" not in model and "lr_scheduler" not in cfg
        assert cfg["quantizer"]["groupsize"] == 256
    else:
        assert model["_component_"] == "torchtune.models.llama3.lora_llama3"
        assert model["lora_rank"] == 8 and model["apply_lora_to_mlp"] is True
        assert cfg["lr_scheduler"]["num_warmup_steps"] == 100
    assert model.get("quantize_base", False) is (technique == "qlora")
    assert ("collate_fn" in cfg) is (technique != "dpo")
    assert model["vocab_size"] == 2048 and model["num_layers"] == 2


def test_config_file_is_valid_yaml(tmp_path, cache):
    plan = plan_of(llm_cell(strategy="qat-lora", world_size=2), tmp_path, cache)
    path = llm_config.write_config(plan)
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert loaded["model"] == plan.config["model"]
    assert loaded["output_dir"] == str(tmp_path / "recipe-output")


def test_cuda_cell_uses_llama3_8b_and_the_users_checkpoint(tmp_path, cache):
    ckpt = tmp_path / "Meta-Llama-3-8B" / "original"
    ckpt.mkdir(parents=True)
    (ckpt / "consolidated.00.pth").write_bytes(b"")
    (ckpt / "tokenizer.model").write_text("")
    cell = llm_cell(tier="gate", device="cuda", world_size=2, precision="bf16", max_seq_len=0)
    plan = plan_of(cell, tmp_path, cache, {"llm_checkpoint_dir": str(ckpt.parent)})
    cfg = plan.config
    assert cfg["model"]["_component_"] == "torchtune.models.llama3.lora_llama3_8b"
    assert cfg["checkpointer"]["_component_"].endswith("SkipSaveMetaCheckpointer")
    assert cfg["checkpointer"]["checkpoint_dir"] == str(ckpt)
    assert cfg["tokenizer"]["path"] == str(ckpt / "tokenizer.model")
    assert cfg["tokenizer"]["max_seq_len"] is None
    assert cfg["optimizer"]["fused"] is True and cfg["dtype"] == "bf16"
    # The distributed LoRA config's own choice stays: no activation checkpointing.
    assert cfg["enable_activation_checkpointing"] is False


def test_dpo_on_a_cuda_cell_uses_the_llama3_builder(tmp_path, cache):
    ckpt = tmp_path / "hf"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model-00001-of-00002.safetensors").write_bytes(b"")
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"")
    cell = llm_cell(strategy="dpo", dataset="stack_exchange_paired", device="cuda",
                    precision="bf16")
    plan = plan_of(cell, tmp_path, cache, {"llm_checkpoint_dir": str(ckpt),
                                           "llm_save_checkpoint": "1"})
    assert plan.config["model"]["_component_"] == "torchtune.models.llama3.lora_llama3_8b"
    assert plan.config["checkpointer"]["_component_"] == \
        "torchtune.training.FullModelHFCheckpointer"
    assert plan.config["checkpointer"]["checkpoint_files"] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize("changes, message", [
    ({"strategy": "dpo"}, "preference dataset"),
    ({"dataset": "stack_exchange_paired"}, "instruction dataset"),
    ({"precision": "fp64"}, "fp32 or bf16"),
])
def test_cells_the_recipes_cannot_run_are_refused(changes, message, tmp_path, cache):
    with pytest.raises(ValueError, match=message):
        plan_of(llm_cell(**changes), tmp_path, cache)


def test_missing_checkpoint_dir_says_what_to_do(tmp_path, cache):
    cell = llm_cell(device="cuda", precision="bf16")
    with pytest.raises(FileNotFoundError, match="consolidated.00.pth"):
        plan_of(cell, tmp_path, cache, {"llm_checkpoint_dir": str(tmp_path / "none")})


def test_tiny_model_refuses_the_real_tokenizer(tmp_path, cache):
    tok = tmp_path / "tokenizer.model"
    tok.write_text("")
    with pytest.raises(ValueError, match="2048"):
        plan_of(llm_cell(), tmp_path, cache, {"llm_tokenizer": str(tok)})


def test_experiment_file_cells_all_build(tmp_path, cache):
    """Every smoke cell of llm.toml gives a config (gate/full need CUDA weights)."""
    from perfsuite.cells import load_matrix

    matrix = load_matrix([Path(__file__).parents[2] / "perfsuite" / "experiments" / "llm.toml"])
    smoke = [c for c in matrix.values() if c.tier == "smoke"]
    assert {c.strategy for c in smoke} == {"lora", "qlora", "dpo", "qat", "qat-lora"}
    assert {c.world_size for c in smoke} == {1, 2}
    for cell in smoke:
        assert plan_of(cell, tmp_path, cache).config["batch_size"] == cell.batch_size
    full = [c for c in matrix.values() if c.tier == "full"]
    assert {(c.dataset, c.world_size) for c in full if c.strategy == "lora"
            and c.precision == "fp32" and not c.pin_memory} == {
        (d, w) for d in ("alpaca", "grammar", "samsum", "slimorca") for w in (1, 2, 3, 4)}
    assert all(c.batch_size == 2 and c.lr_warmup_steps == 100 and c.epochs == 1
               for c in full)
