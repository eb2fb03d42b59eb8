"""What is sent: prompts of an exact token length, datasets, shared-prefix sets."""

from pdscope.workload.prompts import (
    Prompt,
    PromptBuilder,
    estimate_prompt,
    prompt_of_length,
    synthetic_text,
)

__all__ = ["Prompt", "PromptBuilder", "estimate_prompt", "prompt_of_length", "synthetic_text"]
