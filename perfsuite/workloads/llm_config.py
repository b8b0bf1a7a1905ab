"""An LLM cell as torchtune runs it: which recipe, and its YAML config.

The config starts from the Llama3-8B config torchtune ships for the recipe
(``tune cp <name>`` would give the same file) and overrides only what the
cell sets, what this machine needs, and what the suite needs to measure. The
result is written beside the cell's results, so ``tune run <recipe>
--config <file>`` repeats the run by hand.

Choices where the papers are silent (also listed in experiments/llm.toml):

- ``gradient_accumulation_steps: 1``: the paper's iteration is "a group of
  dataset rows processed concurrently" and its Table 5 totals match one
  iteration per batch of 2 per GPU (1 GPU: 19,912 s / 0.77 s/it = 25,860
  iterations = 51,760 rows / 2); torchtune's configs accumulate 8.
- ``seed: 0`` (configs: null) so that every run sees the same batches;
  ``compile: False``, ``packed: False`` as in torchtune's configs.
- ``save_adapter_weights_only: True`` and checkpointers that do not write the
  trained model (``llm_save_checkpoint=1`` restores saving): saving happens
  after the last step and is no part of a step.
- Activation checkpointing as torchtune's config for the recipe sets it on
  CUDA (a user's default); off on CPU, where the tiny model needs no memory
  saving. Fused AdamW on CUDA as configured; unfused on CPU (no fused CPU
  kernel for every dtype).
- DPO uses torchtune's Llama3.1 DPO configs with the Llama3-8B model builder,
  so every technique trains the same architecture; its loss (DPOLoss, beta
  0.1) and dataset (stack-exchange-paired) are the config's.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from perfsuite.system import atomic
from perfsuite.workloads import llm_assets, llm_data

CONFIGS_DIR_HINT = "recipes/configs (installed beside the torchtune package)"


@dataclass(frozen=True)
class RecipeChoice:
    recipe: str  # module under torchtune's ``recipes`` package
    base_config: str  # torchtune's shipped config, relative to recipes/configs
    model_kind: str  # base (full fine-tune), lora or qlora


SINGLE_DEVICE = {
    "lora": RecipeChoice("lora_finetune_single_device", "llama3/8B_lora_single_device.yaml",
                         "lora"),
    "qlora": RecipeChoice("lora_finetune_single_device", "llama3/8B_qlora_single_device.yaml",
                          "qlora"),
    "dpo": RecipeChoice("lora_dpo_single_device", "llama3_1/8B_lora_dpo_single_device.yaml",
                        "lora"),
}
DISTRIBUTED = {
    "lora": RecipeChoice("lora_finetune_distributed", "llama3/8B_lora.yaml", "lora"),
    # torchtune ships no 8B QLoRA distributed config; its 405B QLoRA config
    # runs this recipe with a qlora_* model builder, as here.
    "qlora": RecipeChoice("lora_finetune_distributed", "llama3/8B_lora.yaml", "qlora"),
    "dpo": RecipeChoice("lora_dpo_distributed", "llama3_1/8B_lora_dpo.yaml", "lora"),
    "qat": RecipeChoice("qat_distributed", "llama3/8B_qat_full.yaml", "base"),
    "qat-lora": RecipeChoice("qat_lora_finetune_distributed", "llama3/8B_qat_lora.yaml",
                             "lora"),
}
LORA_KEYS = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
             "lora_alpha", "lora_dropout")
DTYPES = {"fp32": "fp32", "bf16": "bf16"}


def choose_recipe(technique: str, world_size: int) -> RecipeChoice:
    """Single-device recipe on one rank where torchtune has one, else distributed."""
    if world_size == 1 and technique in SINGLE_DEVICE:
        return SINGLE_DEVICE[technique]
    if technique not in DISTRIBUTED:
        raise ValueError(f"unknown LLM technique {technique!r}; known: {sorted(DISTRIBUTED)}")
    return DISTRIBUTED[technique]


def recipes_dir() -> Path:
    """torchtune installs its recipes (files, not a package) beside itself."""
    import torchtune

    return Path(torchtune.__file__).parent.parent / "recipes"


def configs_dir() -> Path:
    return recipes_dir() / "configs"


def load_recipe(name: str) -> ModuleType:
    """The recipe file as a module, as ``tune run`` executes it but for ``__main__``.

    Loading it without running lets the run patch names it imported
    (``llm_compat``, ``llm_watch``) before ``recipe_main`` is called.
    """
    path = recipes_dir() / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"torchtune recipe {path} is missing (torchtune 0.6.1 ships it)")
    module_name = f"torchtune_recipe_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def load_base_config(relative: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    path = configs_dir() / relative
    if not path.is_file():
        raise FileNotFoundError(f"torchtune config {path} is missing; torchtune 0.6.1 ships it "
                                f"under {CONFIGS_DIR_HINT}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def check_dataset(technique: str, dataset: str) -> str:
    """DPO trains on preference pairs, every other technique on instruction rows."""
    kind = llm_data.spec(dataset).kind
    if (technique == "dpo") != (kind == "preference"):
        wanted = "a preference dataset" if technique == "dpo" else "an instruction dataset"
        known = sorted(n for n, d in llm_data.DATASETS.items()
                       if (d.kind == "preference") == (technique == "dpo"))
        raise ValueError(f"{technique} needs {wanted}, not {dataset!r}; use one of {known}")
    return dataset


@dataclass
class RecipePlan:
    """Everything one rank needs to start the recipe, and what it was told."""

    recipe: str
    distributed: bool
    config: dict[str, Any]
    config_path: Path
    step_log: Path
    model_size: str
    info: dict[str, Any] = field(default_factory=dict)


def build_plan(cell: Any, rank: int, world_size: int, out_dir: Path, options: dict[str, str],
               cache_dir: Path, seed: int = 0) -> RecipePlan:
    """The recipe and config of ``cell`` on this rank (the config is not written yet)."""
    if cell.precision not in DTYPES:
        raise ValueError(f"torchtune's recipes train in fp32 or bf16, not {cell.precision!r}")
    choice = choose_recipe(cell.strategy, world_size)
    distributed = choice.recipe.endswith("distributed")
    size = llm_assets.model_size(cell.device, options)
    cuda = cell.device == "cuda"
    cfg = load_base_config(choice.base_config)
    out_dir = Path(out_dir)
    output_dir = out_dir / "recipe-output"
    step_log = out_dir / f"llm-steps-rank{rank}.jsonl"

    lora = {k: cfg["model"][k] for k in LORA_KEYS if k in cfg["model"]}
    if choice.model_kind != "base" and not lora:
        raise ValueError(f"{choice.base_config} has no LoRA settings to keep")
    dataset = check_dataset(cell.strategy, cell.dataset)
    data_section, data_origin = llm_data.dataset_source(
        dataset, options.get("llm_data_dir"),
        llm_data.rows_needed(cell.max_steps, cell.batch_size, world_size, cell.epochs, dataset),
        cache_dir)
    if llm_data.spec(dataset).kind == "sft":
        data_section["packed"] = False
        cfg["collate_fn"] = "perfsuite.workloads.llm_watch.padded_collate_sft"
    tokenizer, tokenizer_origin = llm_assets.tokenizer_section(size, options, cell.max_seq_len)
    checkpointer, weights_origin = llm_assets.checkpointer_section(size, options, cache_dir,
                                                                   output_dir)
    cfg.update(
        output_dir=str(output_dir),
        model=llm_assets.model_section(size, choice.model_kind, lora),
        tokenizer=tokenizer,
        checkpointer=checkpointer,
        dataset=data_section,
        seed=seed,
        shuffle=True,
        batch_size=cell.batch_size,
        epochs=cell.epochs,
        max_steps_per_epoch=cell.max_steps if cell.max_steps > 0 else None,
        gradient_accumulation_steps=1,
        resume_from_checkpoint=False,
        save_adapter_weights_only=True,
        metric_logger={"_component_": "perfsuite.workloads.llm_watch.StepLogger",
                       "path": str(step_log),
                       "total_steps": cell.max_steps * cell.epochs if cell.max_steps > 0 else 0},
        log_every_n_steps=1,
        log_peak_memory_stats=False,
        device="cuda" if cuda else "cpu",
        dtype=DTYPES[cell.precision],
        compile=False,
        enable_activation_offloading=False,
    )
    cfg["optimizer"] = {**cfg["optimizer"], "lr": cell.lr, "fused": cuda}
    if "lr_scheduler" in cfg:
        cfg["lr_scheduler"] = {**cfg["lr_scheduler"], "num_warmup_steps": cell.lr_warmup_steps}
    if not cuda:
        cfg["enable_activation_checkpointing"] = False
    if "profiler" in cfg:  # the suite's StepProfiler profiles a window; torchtune's would trace again
        cfg["profiler"] = {**cfg["profiler"], "enabled": False}
    info = {
        "recipe": choice.recipe, "base_config": choice.base_config, "model": size,
        "model_builder": cfg["model"]["_component_"], "weights": weights_origin,
        "quantize_base": choice.model_kind == "qlora",
        "tokenizer": tokenizer_origin, "dataset": dataset, "dataset_source": data_origin,
        "dtype": cfg["dtype"], "gradient_accumulation_steps": 1,
        "activation_checkpointing": cfg.get("enable_activation_checkpointing", False),
        "lr": cell.lr, "lr_warmup_steps": (cell.lr_warmup_steps if "lr_scheduler" in cfg
                                           else "recipe has no scheduler (constant lr)"),
        "max_seq_len": tokenizer["max_seq_len"], "max_steps_per_epoch":
            cfg["max_steps_per_epoch"], "batch_size_per_rank": cell.batch_size,
    }
    return RecipePlan(choice.recipe, distributed, cfg, out_dir / f"llm-recipe-rank{rank}.yaml",
                      step_log, size, info)


def write_config(plan: RecipePlan) -> Path:
    from omegaconf import OmegaConf

    atomic.atomic_write_text(plan.config_path, OmegaConf.to_yaml(OmegaConf.create(plan.config)))
    return plan.config_path
