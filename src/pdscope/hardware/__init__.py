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
    BandwidthProbe,
    cpu_model_name,
    detect_local_device,
    local_cpu_spec,
    nvidia_smi_gpus,
    probe_cpu_bandwidth,
    probe_cpu_matmul_tflops,
)

__all__ = [
    "BandwidthProbe",
    "DeviceSpec",
    "all_devices",
    "article_devices",
    "cpu_model_name",
    "detect_local_device",
    "find_device",
    "local_cpu_spec",
    "match_gpu_name",
    "normalise",
    "nvidia_smi_gpus",
    "probe_cpu_bandwidth",
    "probe_cpu_matmul_tflops",
]
