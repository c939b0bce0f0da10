"""The scheduler's streaming bookkeeping: which sequences each streaming scorer holds,
this step's calls to it, the scores frozen scorers keep for groups trained later, and the
finished sequences a streamed reward is asked for.

A streaming scorer (its own Ray actor, or the forecast's simulated one) prefills the new
tokens of every decode round while the hosts decode the next; `StreamLedger` decides what
each call sends and, when a step's groups are handed over, which scores the experience
maker can take from the streamed calls (`StreamedScores`) and which it computes again."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from asr_grpo.experience.types import PromptGroup, SequenceRef
from asr_grpo.rollout.types import SequenceResult

if TYPE_CHECKING:
    import torch

    from asr_grpo.overlap.scheduler import BufferedGroup

log = logging.getLogger(__name__)


def never_died(exc: BaseException) -> bool:
    """For callers whose calls run in-process: no error means a process died."""
    return False


class StreamedScores:
    """What one streaming scorer returns for the sequences trained on this step. Which
    sequences it covers is known at once; `get()` waits for its last chunks, so the
    caller can start other work (the actor's old log-probs) while the scorers drain.
    `stash` (frozen scorers only) receives the scores of sequences that finished this
    step but are trained later, so they are not computed twice. `resolve` awaits a call
    (`ray.get`); a call whose scorer died (`is_death`) is left out of `get()`."""

    def __init__(self, uids: set[str], pending: list, known: dict[str, torch.Tensor] | None = None,
                 stash: dict[str, torch.Tensor] | None = None, *, resolve: Callable,
                 is_death: Callable[[BaseException], bool] = never_died, discard: frozenset[str] = frozenset()):
        self.uids, self._pending, self._scores = uids | set(known or {}), pending, None
        self._resolve, self._is_death = resolve, is_death
        self._known, self._stash = dict(known or {}), stash
        self._discard = discard   # sequences of dropped groups: never stashed
        self.lost_calls = 0   # calls a scorer restart lost: their sequences are missing from get()

    def get(self) -> dict[str, torch.Tensor]:
        if self._scores is None:
            merged: dict[str, torch.Tensor] = dict(self._known)
            for ref in self._pending:
                try:
                    merged.update(self._resolve(ref))
                except Exception as exc:
                    if not self._is_death(exc):
                        raise
                    self.lost_calls += 1
            if self.lost_calls:
                log.warning("a streaming scorer restarted: %d of its calls were lost", self.lost_calls)
            if self._stash is not None:
                self._stash.update({u: v for u, v in merged.items() if u not in self.uids and u not in self._discard})
            self._scores = {u: merged[u] for u in self.uids if u in merged}
        return self._scores


class StreamLedger:
    """`scorers`: name -> role group (`call`, `call_rank`, `world_size`). Scorers whose
    weights never change (`frozen`: reference, reward model) keep the caches of carried
    sequences across steps; the others re-prefill them. `on_finished(groups, sequences)`
    (a reward service) is called once per decode call with the sequences that finished in
    it, so their rewards are requested at once."""

    def __init__(self, scorers: Mapping, frozen: Iterable[str] = (),
                 on_finished: Callable[[list[PromptGroup], list[SequenceResult]], None] | None = None, *,
                 resolve: Callable, is_death: Callable[[BaseException], bool] = never_died):
        self.scorers = dict(scorers)
        self.frozen = set(frozen) & set(self.scorers)
        self.on_finished = on_finished
        self._sent: set[str] = set()   # finished sequences given to `on_finished`, not trained yet
        self._resolve, self._is_death = resolve, is_death
        self.registered: set[tuple[str, str]] = set()   # (scorer, sequence uid) a scorer holds
        self.rescored = 0   # the last hand-over's sequences streamed to their end but scored again
        # Per scorer: this step's calls, the sequences finished this step, the scores kept
        # (frozen scorers), and the sequences streamed to their end but not trained yet.
        self._pending: dict[str, list] = {name: [] for name in self.scorers}
        self._finishing: dict[str, set[str]] = {name: set() for name in self.scorers}
        self._stash: dict[str, dict[str, torch.Tensor]] = {name: {} for name in self.frozen}
        self._streamed_done: dict[str, set[str]] = {name: set() for name in self.scorers}
        self._dropped: set[str] = set()   # this step's sequences of dropped groups

    @property
    def active(self) -> bool:
        """Whether streaming has anyone to stream to."""
        return bool(self.scorers) or self.on_finished is not None

    def begin_step(self, live: set[str]) -> None:
        """At a step's start each scorer keeps the caches of the carried sequences in
        `live` it has seen (frozen scorers) or their registrations only (weights changed:
        it re-prefills them), and forgets the rest. A scorer Ray restarted has nothing:
        it reports what it kept, and the rest is registered again when streamed."""
        if not self.scorers:
            return
        names, refs = [], []
        for name, group in self.scorers.items():
            keep = sorted(u for (n, u) in self.registered if n == name and u in live)
            names += [name] * group.world_size
            refs += group.call("begin_step", keep, name not in self.frozen)
        kept = self._resolve(refs)
        self.registered = {(name, u) for name, uids in zip(names, kept) for u in uids}

    def stream(self, touched: list[SequenceResult], entries: Mapping[str, BufferedGroup]) -> None:
        """Send this round's tokens to every streaming scorer without waiting. `entries`:
        group uid -> its buffer entry (the group, and the host whose rank it streams to)."""
        for name, scorer in self.scorers.items():
            world = scorer.world_size
            register = [[] for _ in range(world)]
            feed: list[dict[str, list[int]]] = [{} for _ in range(world)]
            finish = [[] for _ in range(world)]
            for r in touched:
                entry = entries[r.group]
                rank = entry.host % world
                if (name, r.uid) not in self.registered:
                    register[rank].append(SequenceRef(r.uid, entry.group.prompt_ids, [], entry.group.features,
                                                      entry.group.utterance["language"]))
                    self.registered.add((name, r.uid))
                feed[rank][r.uid] = r.tokens
                if r.done:
                    finish[rank].append(r.uid)
                    self._finishing[name].add(r.uid)
                    self._streamed_done[name].add(r.uid)
                    self.registered.discard((name, r.uid))
            for rank in range(world):
                if feed[rank] or register[rank]:
                    self._pending[name].append(
                        scorer.call_rank(rank, "stream", register[rank], feed[rank], finish[rank]))

    def send_finished(self, touched: list[SequenceResult], groups: Mapping[str, PromptGroup]) -> int:
        """The finished sequences among `touched` not sent before (a decode call's
        results repeat what its feed sent), with their groups, to `on_finished`;
        returns how many went."""
        finished = [r for r in touched if r.done and r.uid not in self._sent]
        if self.on_finished is None or not finished:
            return 0
        self._sent.update(r.uid for r in finished)
        self.on_finished(list({r.group: groups[r.group] for r in finished}.values()), finished)
        return len(finished)

    def mark_sent(self, uids: list[str]) -> None:
        """Finished sequences a host's feed already sent (rollout/feed.py): not again."""
        self._sent.update(uids)

    def drop(self, uids: list[str]) -> None:
        """Finished sequences of groups that will never train (dynamic sampling dropped
        them): forget them everywhere; their scores, in calls already sent, are discarded."""
        gone = set(uids)
        self._dropped |= gone
        self._sent -= gone
        for name in self.scorers:
            self._finishing[name] -= gone
            self._streamed_done[name] -= gone
        for stash in self._stash.values():
            for u in gone & set(stash):
                del stash[u]

    def hand_over(self, uids: list[str], waiting: set[str]) -> dict[str, StreamedScores]:
        """This step's scorer calls go to the experience maker, for the trained sequences
        `uids`. Sequences that finished during this step are covered, and for frozen
        scorers also those that finished earlier while their group waited (their scores
        were kept). A waiting sequence of a scorer whose weights change is scored again
        when trained on, with that step's weights (as serially). `waiting`: the finished
        sequences of the groups still carried, whose kept scores stay."""
        out = {}
        self.rescored = 0
        self._sent.difference_update(uids)
        for name in self.scorers:
            stash = self._stash.get(name)
            known = {u: stash.pop(u) for u in uids if stash is not None and u in stash}
            # Streamed to their end in an earlier step, scores not kept: scored again (waste).
            done = self._streamed_done[name]
            finishing = self._finishing[name]
            self.rescored += sum(u in done and u not in finishing and u not in known for u in uids)
            done.difference_update(uids)
            out[name] = StreamedScores({u for u in uids if u in finishing}, self._pending[name],
                                       known, stash, resolve=self._resolve, is_death=self._is_death,
                                       discard=frozenset(self._dropped))
        # Kept scores no carried group still waits for (a scorer restart, a drop) go.
        for stash in self._stash.values():
            for u in [u for u in stash if u not in waiting]:
                del stash[u]
        self._pending = {name: [] for name in self.scorers}
        self._finishing = {name: set() for name in self.scorers}
        self._dropped = set()
        return out
