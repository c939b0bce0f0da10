"""A minimal complete reward file: character accuracy, nothing for a truncated transcript.

Use it with

    python -m asr_grpo.run reward.reward_file=examples/rewards/char_accuracy.py

The toolkit imports this file (asr_grpo.rewards.loader.load_reward_function) inside the
reward worker and calls `reward_func` once per batch of N sampled transcripts:

    queries[i]   the decoded response (the audio prompt has no text of its own)
    prompts[i]   "" (the same reason)
    labels[i]    the reference transcript from the manifest
    kwargs       responses, languages ("en", "zh", "de", ...), keywords, finish_reasons
                 ("stop" | "length"), weights (reward.weights) and, with
                 reward.smoothness_scorer=lm, lm_scores; take what you need, accept the rest.

It returns one value per sample: "rewards" (what RL optimises), optionally "scores"
(defaults to the rewards) and "extra_logs" (each logged to MLflow as reward/<name>).

Values (docs/rewards.md; tests/docs/test_docs.py calls this file through the loader):

    reference "the cat sat", transcript "the cat sat", stopped      -> 1.0
    reference "the cat sat", transcript "the cat", stopped          -> 7/11 (4 of 11 chars deleted)
    reference "我爱北京天安门", transcript "我爱北京", stopped          -> 4/7
    reference "the cat sat", transcript "the cat sat", hit the cap  -> 0.0
"""
import torch

from asr_grpo.rewards import split_asr_output, utterance_cer


def reward_func(queries, prompts, labels, **kwargs):
    responses = kwargs.get("responses") or list(queries)
    languages = kwargs["languages"]
    finish_reasons = kwargs.get("finish_reasons") or ["stop"] * len(labels)

    accuracy, truncated = [], []
    for response, label, language, finish in zip(responses, labels, languages, finish_reasons, strict=True):
        _, transcript = split_asr_output(response)   # drops a leading "language X<asr_text>"
        accuracy.append(max(0.0, 1.0 - utterance_cer(transcript, label, language)))
        truncated.append(1.0 if finish == "length" else 0.0)

    accuracy_t = torch.tensor(accuracy, dtype=torch.float32)
    truncated_t = torch.tensor(truncated, dtype=torch.float32)
    rewards = accuracy_t * (1.0 - truncated_t)
    return {"rewards": rewards, "scores": rewards,
            "extra_logs": {"char_accuracy": accuracy_t, "truncated": truncated_t}}
