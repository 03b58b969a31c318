"""Self-training (the paper's Algorithm 2) over any registered method, as resumable stages.

    config.py     SelfTrainConfig and its sections
    loop.py       SelfTrain: base evaluation, M0, iterations of rollout, rationalize, train, calibrate, evaluate
    context.py    what the stages share: config, folder, processes, questions, corpus, retriever, generators
    bootstrap.py  iteration 0 (gold records of the method, LoRA, merge) = M0
    rollout_stage.py  a model over questions as a stage (rollouts, dev evaluations, the probe)
    rationalize.py    correct rollouts -> the records the adapters train on
    training.py   each role's adapter trained by the run's training mode
    calibration.py    a trained model's decision thresholds
    beside.py     the dev evaluations, in turn or beside the next stages
    rollout.py    chunked, resumable rollouts split across processes
    models.py     ModelState, the records of a stage, the model of a finished run's iteration
    folder.py     the run folder's config.yaml, its launch record, the resume check
    reuse.py      stage outputs shared across runs (base eval, probe, M0, its eval, iteration 1 rollouts)
    grid.py       the grid's point chosen on dev, reported on the test split
"""

from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.folder import check_same_config
from knowtrace_train.selftrain.loop import SelfTrain, select_questions
from knowtrace_train.selftrain.models import ModelState

__all__ = ["ModelState", "SelfTrain", "SelfTrainConfig", "check_same_config", "select_questions"]
