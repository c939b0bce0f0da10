"""The simulator against step times worked out by hand: one engine, rounds of 1 s whatever
the rows, scoring 0.1 s per token on a GPU of its own, so every mode's timeline can be
followed on paper. Groups alternate 4 and 10 tokens (one sample each): p-0 = 4, p-1 = 10,
p-2 = 4, ..."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.forecast import DecodeCost, Forward, RoleCost, SimProfile, Simulation, Workload


def alternating(uid: str) -> list[int]:
    return [4 if int(uid.rsplit("-", 1)[1]) % 2 == 0 else 10]


def constant_profile(**kw) -> SimProfile:
    """Round 1 s; old log-probs 0.01 s/token (actor GPUs), reference 0.1 s/token (its own
    GPU), training 0.01 s/token, sync 0.5 s; no prefill, call or driver costs."""
    base = dict(source="test", hosts=1, rollout_device="actor", decode=DecodeCost(overhead_s=1.0),
                prefill=Forward(), roles={"actor": RoleCost("actor", Forward(per_token_s=0.01), 0.01),
                                          "ref": RoleCost("score", Forward(per_token_s=0.1))},
                streaming=["ref"], sync_s=0.5)
    base.update(kw)
    return SimProfile(**base)


def workload(B: int = 2) -> Workload:
    return Workload(None, B=B, n=1, max_new_tokens=64, prompt_text_tokens=0, scripted=alternating)


def steps(mode: str, k: int = 4, profile: SimProfile | None = None, **overlap) -> list[float]:
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, **{"controller": "fixed", **overlap}))
    sim = Simulation(profile or constant_profile(), workload(), cfg, mode)
    return [round(r.step_s, 6) for r in sim.run(k)]


def test_none_decodes_the_longest_then_scores_trains_and_syncs():
    # 10 rounds (10 s); old log-probs 0.14 s beside the reference's 1.4 s (14 tokens);
    # training 0.14 s; sync 0.5 s.
    assert steps("none") == [12.04] * 4


def test_intra_streams_chunks_so_only_the_last_chunk_is_scored_after_decoding():
    # Calls of 4, 4, 2 rounds end at 4, 8, 10 s. Stream calls: 8 tokens at 4 s (0.8 s),
    # 4 at 8 s (0.4 s), 2 at 10 s (0.2 s, until 10.2). Old log-probs 10-10.14. Scoring
    # ends at 10.2; training 0.14; sync 0.5: 10.84.
    assert steps("intra", chunk_size=4) == [10.84] * 4


def test_inter_trains_the_first_two_to_finish_and_carries_the_long_one():
    # Step 0: p-0, p-1, p-2; p-0 and p-2 finish at round 4: 4 + 0.8 + 0.08 + 0.5 = 5.38.
    # Step 1: p-1 (6 left), p-3 (10), p-4 (4): p-4 at 4, p-1 at 6: 6 + 1.4 + 0.14 + 0.5 = 8.04;
    #   p-3 carried with 6 tokens.
    # Step 2: p-3 (4 left), p-5 (10), p-6 (4): both at round 4: 4 + 1.4 + 0.14 + 0.5 = 6.04;
    #   p-5 carried with 4 tokens, so step 3 is step 1 again.
    assert steps("inter", delta_init=1) == [5.38, 8.04, 6.04, 8.04]


def test_oppo_streams_and_carries():
    # Plan fixed at chunk 4, Δ 1 (trial controller, one candidate, Δ bounds 1..1).
    # Step 0: one call of 4 rounds ends at 4 s, p-0 and p-2 done; stream 12 tokens (the
    #   carried p-1's 4 too): 4-5.2. Old log-probs 4-4.08; scoring ends 5.2; training
    #   0.08; sync 0.5: 5.78.
    # Step 1 (from 5.78): call 1, 4 rounds to 9.78 (p-4 done, p-1 at 8); stream 12 tokens
    #   9.78-10.98; call 2, 2 rounds to 11.78 (p-1 done: quota met); stream 4 tokens
    #   11.78-12.18. Old log-probs 11.78-11.92; scoring ends 12.18; training 0.14; sync
    #   0.5: 12.82, a step of 7.04; p-3 carried with 6 tokens.
    # Step 2: one call of 4 rounds, p-3 and p-6 done; stream 12 tokens (1.2 s); old
    #   log-probs 0.14; training 0.14; sync 0.5: 4 + 1.2 + 0.14 + 0.5 = 5.84. Step 3 = step 1.
    got = steps("oppo", controller="trial", chunk_size=4, chunk_candidates=[4], delta_init=1, delta_min=1,
                delta_max=1)
    assert got == [5.78, 7.04, 5.84, 7.04]


def test_a_scorer_on_the_engines_gpu_slows_the_decode_by_what_it_does_not_hide():
    # intra with the reference on the engine's own GPU, half hidden: each stream call's
    # unhidden half delays the next decode call. Stream 8 tokens at 4 s (0.8 s: +0.4 s
    # on call 2), 4 tokens at 8.4 s (0.4 s: +0.2 s on call 3), 2 at 10.6 s (0.2 s,
    # until 10.8, the decode already over: it drains on the GPU after decoding, then
    # the old log-probs 10.8-10.94). Training 0.14, sync 0.5: 11.58.
    shared = constant_profile(roles={"actor": RoleCost("actor", Forward(per_token_s=0.01), 0.01),
                                     "ref": RoleCost("actor", Forward(per_token_s=0.1))}, stream_hidden=0.5)
    assert steps("intra", k=2, profile=shared, chunk_size=4) == [11.58, 11.58]


@pytest.mark.parametrize("mode", ["none", "intra", "inter", "oppo"])
def test_every_step_trains_B_groups_and_none_twice(mode):
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, controller="trial", chunk_size=4, chunk_candidates=[4],
                                             delta_init=1, delta_max=2))
    records = Simulation(constant_profile(), workload(), cfg, mode).run(8)
    trained = [g for r in records for g in r.trained]
    assert all(len(r.trained) == 2 for r in records)
    assert len(trained) == len(set(trained))


def test_down_sampling_scores_and_trains_only_the_kept_samples():
    # Groups of 4 and 10 tokens (n = 2), nothing streamed. All trained: 10 rounds; old
    # log-probs 0.28 s beside the reference's 2.8 s (2 groups x 14 tokens); training
    # 0.28 s; sync 0.5 s: 13.58. One of each group trained: the reference scores 14 tokens
    # (1.4 s), training 0.14 s: 12.04. Decoding is the same: all samples are drawn.
    cfg = OmegaConf.structured(OverlapConfig(mode="none", controller="fixed"))

    def step_s(trained: int | None) -> list[float]:
        load = Workload(None, B=2, n=2, max_new_tokens=64, prompt_text_tokens=0, train_samples=trained,
                        scripted=lambda uid: [4, 10])
        return [round(r.step_s, 6) for r in Simulation(constant_profile(), load, cfg, "none").run(3)]

    assert step_s(None) == [13.58] * 3
    assert step_s(1) == [12.04] * 3
