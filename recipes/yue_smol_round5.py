"""Round 5 of yue-smol's top-layer NAR set: the issue-42 campaign (`recipes/yue_smol_campaign.py`) on a lent GPU
(a device-side wrapper, not part of the package).

The device image's transformers may read GGUF files without Q4_1 blocks; this adds the block size
(32 weights in 20 bytes) before `recipes.yue_smol_campaign.main` runs with the arguments given, e.g. as it ran
on the H200 (2026-12-04; `recipes/yue_smol_round5.sh` has the whole command):
    python -m recipes.yue_smol_round5 --dir /tmp/c42 --base smol.gguf --init yue/assets/yue-smol \
        --device cuda --chunk-prompts 2048 --gen-batch 512 --steps 400 --batch-size 32 --anchors 32 ...
"""

import sys

import transformers.integrations.gguf.reader as reader

from recipes.yue_smol_campaign import main

if 3 not in reader.GGML_BLOCK:
    reader.GGML_BLOCK[3] = (32, 20)
    reader.GGML_NAME[3] = "Q4_1"

if __name__ == "__main__":
    main(sys.argv[1:])
