"""Group N: a third held-out group of the kinds of group K (`kinds.py`), at other widths,
depths, lengths and sizes than groups K and L.

Defined and committed before any of them was measured on a chip, after the time model's
fit on the third set of microbenchmarks (`micro_cases_l.py`: gathers and scatters on
tables laid out transposed) was committed, and never tuned on: the model is compared with
them as committed. Its recsys tables have 16 and 48 lanes (libtpu lays tables of fewer than
128 lanes out transposed where that saves memory); the other kinds one size each, at
shapes no earlier group had. Same builders and conventions as group K; the Pallas rows
lower for a TPU only.
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


# name -> (builder, sizes): group N.
AFTER_L: dict[str, tuple[Callable[[int], Case], tuple[int, ...]]] = {
    "moe-four-experts": (lambda s: moe(s, layers=3, d=1024, experts=4, top_k=2, seq=512), (8,)),
    "unet-wide": (lambda s: unet(s, channels=(32, 96, 192), image=32), (32,)),
    "long-attention-short-wide": (lambda s: long_attention(s, layers=3, d=1536, heads=12, seq=2048), (2,)),
    "ssm-wide-state": (lambda s: ssm(s, layers=3, d=256, state=32, seq=512), (8,)),
    "recsys-thin-tables": (
        lambda s: recsys(s, tables=(2_000_000, 500_000, 60_000, 8_000), dim=16, bag=8),
        (8192,),
    ),
    "recsys-mid-tables": (lambda s: recsys(s, tables=(1_500_000, 120_000, 2_000), dim=48, bag=12), (4096,)),
    "graph-net-sparse": (lambda s: graph(s, layers=2, latent=512, degree=4), (8192,)),
    "accumulate-2": (lambda s: accumulate(s, micro=2, layers=3, d=1024, heads=16, seq=512), (16,)),
    "lstm-wide": (lambda s: lstm(s, layers=2, hidden=512, embed=512, seq=512), (32,)),
    "flash-attention-mid": (lambda s: flash(s, layers=3, d=1024, heads=8, seq=2048), (2,)),
    "pallas-matmul-wide": (lambda s: pallas_mlp(s, width=3072, layers=3, features=1024), (8192,)),
    "decode-wide-model": (lambda s: decode(s, layers=6, d=2048, heads=16, cache=1024), (8,)),
    "wavenet-thin": (lambda s: wavenet(s, stacks=4, channels=32, length=8192), (16,)),
    "offload-dots-wide": (lambda s: offload(s, layers=4, d=1536, heads=12, seq=1024), (4,)),
}
