"""Everything that runs in a worker process: the Ray actor roles (policy ranks,
reference, critic, LM reward model, rollout workers, the reward worker) and the vLLM
worker extension that receives synced weights inside vLLM's own workers.

Imported by the recipes, never by the layers below (see docs/architecture.md). Modules
are imported one by one (`asr_grpo.workers.policy`, ...): each pulls in Ray and the model
stack, which the forecast, for one, must not pay for.
"""
