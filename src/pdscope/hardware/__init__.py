"""Hardware: published device specs, local detection, and the CPU probes."""

from pdscope.hardware.devices import (
    DeviceSpec,
    all_devices,
    article_devices,
    find_device,
    match_gpu_name,
    normalise,
)
from pdscope.hardware.measure import (
    DEFAULT_SHAPES,
    BandwidthProbe,
    MatmulProbe,
    cpu_model_name,
    detect_local_device,
    local_cpu_spec,
    measure_local_cpu,
    nvidia_smi_gpus,
    prefill_shapes,
    probe_cpu_bandwidth,
    probe_cpu_matmul_tflops,
    probe_cpu_matmuls,
)

__all__ = [
    "DEFAULT_SHAPES",
    "BandwidthProbe",
    "DeviceSpec",
    "MatmulProbe",
    "all_devices",
    "article_devices",
    "cpu_model_name",
    "detect_local_device",
    "find_device",
    "local_cpu_spec",
    "match_gpu_name",
    "measure_local_cpu",
    "normalise",
    "nvidia_smi_gpus",
    "prefill_shapes",
    "probe_cpu_bandwidth",
    "probe_cpu_matmul_tflops",
    "probe_cpu_matmuls",
]
