"""Experience: prompt groups, scored sequences, advantages and the micro-batch losses."""
from asr_grpo.experience.advantages import Advantages, estimate_advantages
from asr_grpo.experience.prompts import PromptSampler, build_group
from asr_grpo.experience.tensors import length_mask, pad_ragged, unpad
from asr_grpo.experience.types import ExperienceItem, PromptGroup, SequenceRef

__all__ = ["Advantages", "ExperienceItem", "PromptGroup", "PromptSampler", "SequenceRef", "build_group",
           "estimate_advantages", "length_mask", "pad_ragged", "unpad"]
