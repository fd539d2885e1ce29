"""Group L: a second held-out group of the kinds of group K (`kinds.py`), at other widths,
depths, lengths and sizes.

Defined and committed before any of them was measured on a chip, and before the time
model's refit on the second set of microbenchmarks (`micro_cases_k.py`: scatters into
large tables, strided slices, layout copies, Pallas flash attention) was committed; never
tuned on: the model is compared with them only once that refit is committed. Same
builders and conventions as group K; the Pallas rows lower for a TPU only.
"""

from collections.abc import Callable

from kinds import (
    accumulate,
    decode,
    flash,
    graph,
    long_attention,
    lstm,
    moe,
    offload,
    pallas_mlp,
    recsys,
    ssm,
    unet,
    wavenet,
)
from models import Case


# name -> (builder, sizes): group L.
AFTER_K: dict[str, tuple[Callable[[int], Case], tuple[int, ...]]] = {
    "moe-wide": (lambda s: moe(s, layers=2, d=768, experts=16, top_k=1, seq=1024), (8, 24)),
    "unet-large-images": (lambda s: unet(s, channels=(32, 64, 128), image=64), (16, 64)),
    "long-attention-thin-heads": (lambda s: long_attention(s, layers=2, d=768, heads=12, seq=4096), (2,)),
    "ssm-long": (lambda s: ssm(s, layers=2, d=512, state=16, seq=1024), (4, 8)),
    "recsys-huge-table": (
        lambda s: recsys(s, tables=(1_000_000, 300_000, 30_000, 5_000), dim=32, bag=16),
        (4096, 16384),
    ),
    "graph-net-dense": (lambda s: graph(s, layers=3, latent=256, degree=16), (4096, 16384)),
    "accumulate-4": (lambda s: accumulate(s, micro=4, layers=2, d=768, heads=12, seq=1024), (16, 32)),
    "lstm-long": (lambda s: lstm(s, layers=1, hidden=768, embed=256, seq=256), (16, 64)),
    "flash-attention-long": (lambda s: flash(s, layers=2, d=768, heads=6, seq=4096), (1, 4)),
    "pallas-matmul-narrow": (lambda s: pallas_mlp(s, width=2048, layers=6, features=512), (4096, 16384)),
    "decode-long-cache": (lambda s: decode(s, layers=12, d=1024, heads=16, cache=4096), (4, 16)),
    "wavenet-deep": (lambda s: wavenet(s, stacks=3, channels=64, length=4096), (8, 32)),
    "offload-dots-long": (lambda s: offload(s, layers=6, d=768, heads=12, seq=2048), (2,)),
}
