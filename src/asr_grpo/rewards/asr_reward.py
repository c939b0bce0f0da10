"""The default ASR reward file (`reward.reward_file: ""` loads this one).

It follows OpenRLHF's remote reward-function contract; copy it, change the formula and
point `reward.reward_file` at your copy. The toolkit calls

    reward_func(queries, prompts, labels, **kwargs) -> {
        "rewards": tensor[N],                  # what RL optimises
        "scores": tensor[N],                   # what dynamic filtering / logging read
        "extra_logs": {name: tensor[N], ...},  # logged as reward/<name>
    }

with queries[i] = decoded prompt + response, prompts[i] = decoded prompt and
labels[i] = reference transcript, and in kwargs: responses (response text, EOS
stripped), languages (codes: "en", "zh", "de", ...), keywords (list of lists), finish_reasons
("stop" | "length"), weights ({component: weight}; defaults if absent) and, optional,
lm_scores (one float in [0, 1] per sample, or None/absent: the text LM's fluency of
each response, see asr_grpo.models.text_lm; `reward.smoothness_scorer: lm`).

Here rewards = the weighted, weight-normalised sum of the registered components
(cer, keyword, language, smoothness and any other in
asr_grpo.rewards.components.REWARD_COMPONENTS), scores = the same total (so dynamic
filtering sees the signal being trained on), extra_logs = each component. With
lm_scores, the smoothness component IS lm_scores (the rule-based score is still computed
and logged as extra_logs["smoothness_rule"], never part of the total); without them
nothing changes. An lm_scores value
outside [0, 1] is an error; a non-finite one is passed on, so the caller's
on_bad_reward policy (error | drop) handles that sample.
"""
import math

import torch

from asr_grpo.rewards import (
    DEFAULT_WEIGHTS,
    RewardSample,
    combine,
    score_samples,
    split_asr_output,
)


def _lm_smoothness(lm_scores, n: int) -> torch.Tensor:
    values = [float(v) for v in lm_scores]
    if len(values) != n:
        raise ValueError(f"lm_scores has {len(values)} values for {n} samples")
    bad = [i for i, v in enumerate(values) if math.isfinite(v) and not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"lm_scores must lie in [0, 1]; samples {bad} have "
                         f"{[values[i] for i in bad]}")
    return torch.tensor(values, dtype=torch.float32)


def reward_func(queries, prompts, labels, **kwargs):
    n = len(queries)
    # Without explicit responses, the response is what follows the prompt in the query.
    responses = kwargs.get("responses") or [q[len(p):] for q, p in zip(queries, prompts)]
    languages = kwargs["languages"]
    keywords = kwargs.get("keywords") or [[] for _ in range(n)]
    finish_reasons = kwargs.get("finish_reasons") or ["stop"] * n
    weights = kwargs.get("weights") or DEFAULT_WEIGHTS

    samples = []
    for response, label, language, kws, finish in zip(
            responses, labels, languages, keywords, finish_reasons, strict=True):
        declared, transcript = split_asr_output(response)
        samples.append(RewardSample(
            transcript=transcript, reference=label, language=language, keywords=kws,
            declared_language=declared, finish_reason=finish, response=response))

    result = score_samples(samples, weights)
    components, total = dict(result.components), result.total
    lm_scores = kwargs.get("lm_scores")
    if lm_scores is not None:
        components["smoothness_rule"] = components["smoothness"]
        components["smoothness"] = _lm_smoothness(lm_scores, n)
        total = combine(components, weights)
    return {"rewards": total, "scores": total, "extra_logs": components}
