"""Which utterances become prompts, in a resumable deterministic order, and turning one
into a prompt group."""
from __future__ import annotations

import numpy as np

from asr_grpo.experience.types import PromptGroup


class PromptSampler:
    """Epoch-wise permutations from a seed; the state is two integers, so a resumed run
    draws exactly the prompts the uninterrupted run would have."""

    def __init__(self, num_items: int, seed: int):
        if num_items <= 0:
            raise ValueError("the training manifest has no usable utterance")
        self.num_items, self.seed = num_items, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_items)

    def draw(self, k: int) -> list[tuple[int, int]]:
        """The next k (epoch, index) pairs: each pair occurs once in a run, so it names a
        draw even when a small prompt set repeats an utterance within one step."""
        out: list[tuple[int, int]] = []
        while len(out) < k:
            if self.position == self.num_items:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            out.append((self.epoch, int(self._order[self.position])))
            self.position += 1
        return out

    def next(self, k: int) -> list[int]:
        return [index for _, index in self.draw(k)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_items": self.num_items}

    def load_state_dict(self, state: dict) -> None:
        if state["num_items"] != self.num_items:
            raise ValueError(f"resume: the training set has {self.num_items} utterances, "
                             f"the checkpoint was made with {state['num_items']}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation()


def build_group(processor, item: dict, n: int, uid: str, step: int, index: int = -1) -> PromptGroup:
    # Imported here: the package's other users (the scheduler, the forecast) load no model code.
    from asr_grpo.models.sequences import encode_prompt

    prompt_ids, features = encode_prompt(processor, item["audio"], item["language"])
    meta = {k: item[k] for k in ("id", "text", "language", "keywords")}
    # From the audio the prompt holds (speed perturbation changes it), for reward files.
    meta["duration"] = len(item["audio"]) / processor.feature_extractor.sampling_rate
    return PromptGroup(uid=uid, utterance=meta, prompt_ids=prompt_ids, features=features, n=n, entered_step=step,
                       item_index=index)
