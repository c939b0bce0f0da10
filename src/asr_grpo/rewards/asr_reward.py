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
stripped), languages ("en" | "zh"), keywords (list of lists), finish_reasons
("stop" | "length") and weights ({component: weight}; defaults if absent).

Here rewards = the weighted, weight-normalised sum of the four components
(cer, keyword, language, smoothness; see asr_grpo.rewards.components), scores = the
same total (so dynamic filtering sees the signal being trained on), extra_logs = each
component.
"""
from asr_grpo.rewards import DEFAULT_WEIGHTS, RewardSample, score_samples, split_asr_output


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
    return {"rewards": result.total, "scores": result.total,
            "extra_logs": dict(result.components)}
