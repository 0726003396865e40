"""Which GPUs a job may use, from the environment its launcher set: the `gpu_ids` a
tracker and EmissionsTracker(gpu_ids=...) default to, as codecarbon does.

CUDA_VISIBLE_DEVICES first (codecarbon's own test expects it to win), then AMD's:
ROCR_VISIBLE_DEVICES picks among the node's GPUs and HIP_VISIBLE_DEVICES among those
ROCR left, so with both set a HIP index is resolved through the ROCR list. An unset or
empty variable is skipped. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping


def _ids(value: str | None) -> list[str]:
    # As codecarbon reads them: spaces and stray characters dropped; UUIDs keep '-'.
    kept = "".join(c for c in value or "" if c.isalnum() or c in "-,")
    return [part for part in kept.split(",") if part]


def visible_gpu_ids(environ: Mapping[str, str], amd_prefix: str = "") -> list[str] | None:
    """The GPU ids the environment makes visible, or None when it does not restrict.

    amd_prefix: put before the indices AMD's variables give, for an exporter that
    labels AMD GPUs amd0, amd1... beside NVIDIA ones (docs/power-models.md). UUIDs are
    returned as given.
    """
    cuda = _ids(environ.get("CUDA_VISIBLE_DEVICES"))
    if cuda:
        return cuda
    rocr = _ids(environ.get("ROCR_VISIBLE_DEVICES"))
    hip = _ids(environ.get("HIP_VISIBLE_DEVICES"))
    if rocr and hip and all(h.isdigit() for h in hip):
        # HIP counts among the GPUs ROCR left visible; an index past them sees none.
        hip = [rocr[int(h)] for h in hip if int(h) < len(rocr)]
        chosen = hip
    else:
        chosen = hip or rocr
        if not chosen:
            return None
    return [amd_prefix + g if g.isdigit() else g for g in chosen]
