"""Self-training (the paper's Algorithm 2) over any registered method, as resumable stages.

    config.py     SelfTrainConfig and its sections
    loop.py       SelfTrain: base evaluation, M0, iterations of rollout, rationalize, train, evaluate
    bootstrap.py  iteration 0 (gold records of the method, LoRA, merge) = M0
    rollout.py    chunked, resumable rollouts split across processes
    models.py     ModelState, the records of a stage
    reuse.py      stage outputs shared across runs (base eval, probe, M0, its eval, iteration 1 rollouts)
"""

from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.loop import SelfTrain, check_same_config, select_questions
from knowtrace_train.selftrain.models import ModelState

__all__ = ["ModelState", "SelfTrain", "SelfTrainConfig", "check_same_config", "select_questions"]
