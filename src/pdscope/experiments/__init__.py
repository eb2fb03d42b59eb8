"""The article's experiments, each a library function with a command of its own."""

from pdscope.experiments.probe import ProbeConfig, ProbeResult, ceiling_verdict, run_probe

__all__ = ["ProbeConfig", "ProbeResult", "ceiling_verdict", "run_probe"]
