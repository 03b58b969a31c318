"""LoRA training per role (TRL + PEFT) and what follows it: merging adapters into weights, exporting a run.

    lora.py       LoraTrainConfig, record tokenization, `train_role`, the adapter's training record, and
                  `train_adapter`: the steps every mode's trainer runs, the mode's parts (`RoleTraining`) as hooks
    kto.py        `train_role_kto`: KTO of one role on labelled records, M0 the reference (mode: kto)
    grpo.py       `train_role_grpo`: GRPO of one role on a method's rollouts (mode: grpo)
    trainer.py    TRL's trainers, counting the tokens they train on
    precision.py  bf16 or fp32 per device
    merge.py      `merge_adapters_into_base`
    export.py   merged, ready-to-serve models of a run's iteration, checked against the adapters
"""
