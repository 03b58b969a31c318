"""LoRA training per role (TRL + PEFT) and what follows it: merging adapters into weights, exporting a run.

    lora.py     LoraTrainConfig, record tokenization, `train_role`, `merge_adapters_into_base`
    export.py   merged, ready-to-serve models of a run's iteration, checked against the adapters
"""
