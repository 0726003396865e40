"""visible_gpu_ids: the GPUs a job's environment makes visible, as codecarbon reads them
(CUDA_VISIBLE_DEVICES first, then ROCR_VISIBLE_DEVICES), with HIP_VISIBLE_DEVICES too."""

from __future__ import annotations

import pytest

from wattprint.jobs.gpuvisible import visible_gpu_ids


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),  # empty: no restriction, as codecarbon
        ({"CUDA_VISIBLE_DEVICES": "2, 3"}, ["2", "3"]),  # codecarbon's test_gpu_ids_from_env
        ({"ROCR_VISIBLE_DEVICES": "1, 2"}, ["1", "2"]),  # ...from_rocr_visible_devices
        # ...cuda_visible_devices_takes_precedence_over_rocr_visible_devices
        ({"CUDA_VISIBLE_DEVICES": "0, 1", "ROCR_VISIBLE_DEVICES": "1, 2"}, ["0", "1"]),
        ({"HIP_VISIBLE_DEVICES": "3"}, ["3"]),
        # HIP picks among what ROCR left: its 1 is the node's 6.
        ({"ROCR_VISIBLE_DEVICES": "4,6", "HIP_VISIBLE_DEVICES": "1"}, ["6"]),
        ({"ROCR_VISIBLE_DEVICES": "4,6", "HIP_VISIBLE_DEVICES": "5"}, []),  # none left
        ({"ROCR_VISIBLE_DEVICES": "GPU-4a0b1c2d3e4f5a6b"}, ["GPU-4a0b1c2d3e4f5a6b"]),
        ({"CUDA_VISIBLE_DEVICES": "MIG-1f2e,\n0"}, ["MIG-1f2e", "0"]),
    ],
)
def test_visible_gpu_ids(environ: dict[str, str], expected: list[str] | None) -> None:
    assert visible_gpu_ids(environ) == expected


def test_amd_indices_get_the_prefix_of_a_node_with_both_vendors() -> None:
    both = {"ROCR_VISIBLE_DEVICES": "0,GPU-4a0b1c2d3e4f5a6b"}
    assert visible_gpu_ids(both, amd_prefix="amd") == ["amd0", "GPU-4a0b1c2d3e4f5a6b"]
    # CUDA's ids are NVIDIA's: never prefixed.
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "1"}, amd_prefix="amd") == ["1"]
