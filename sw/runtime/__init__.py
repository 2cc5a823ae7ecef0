"""Run compiled models: the token loop, the KV cache in accelerator memory, host operations,
sampling and the accounting of every cycle (:mod:`sw.runtime.runtime`)."""

from sw.runtime.runtime import Generation, Runtime, RuntimeFault, StepStats

__all__ = ["Generation", "Runtime", "RuntimeFault", "StepStats"]
