"""A model check of the expert-parallel protocol of moe_ep_dispatch / moe_ep_combine (plain
Python, no GPU).

The kernels cannot run here, and a protocol error on the GPU is a hang or silently wrong rows.
This test executes the cross-rank part of the protocol (rose_aot/kernels/moe_ep_dispatch/
device.py, moe_ep_combine/device.py, protocol.py) step by step for several ranks under many
random interleavings: each rank runs steps (a dispatch, then its combine) in stream order;
the regions and flags exist per epoch parity; a dispatch publishes its per-expert counts and
releases a count flag, writes each row and releases its slot flag; the receiver acquires the
counts of every sender, then each slot; the combine releases a done flag to every peer,
returns each received row with its slot flag, waits for its own copies, and finally for every
peer's done flag. Flags are compared with ">= epoch". It fails if a rank reads counts or a row
that are not the current step's (a peer overwrote them, or has not written them yet), or if no
rank can make progress (deadlock). The negative tests turn one rule off at a time and must
find a violation.
"""

from __future__ import annotations

import random

import pytest

CORRECT = {"double_buffer": True, "done_wait": True, "flag_at_least": True}


class Violation(AssertionError):
    pass


class Rank:
    def __init__(self):
        self.flags = {}  # (kind, parity, peer[, slot]) -> epoch
        self.data = {}  # (kind, parity, peer[, slot]) -> epoch of the step that wrote it


def step_programs(ranks, r, routing, rules):
    """The program of rank r over all steps; yields after every memory step ("wait" when it
    spins). routing[n][r] = list of destination ranks of rank r's copies in step n."""
    W = len(ranks)
    me = ranks[r]

    def wait(rank, key, epoch):
        while True:
            seen = ranks[rank].flags.get(key, 0)
            if (seen - epoch >= 0) if rules["flag_at_least"] else seen == epoch:
                return
            yield "wait"

    def read(key, epoch, what):
        got = me.data.get(key)
        if got != epoch:
            raise Violation(f"rank {r} step epoch {epoch}: {what} {key} holds epoch {got}")

    for n, dests in enumerate(routing):
        epoch = n + 1
        par = epoch & 1 if rules["double_buffer"] else 0
        # --- dispatch: counts, then rows with per-slot flags (slots per destination) -------
        slots = {d: [] for d in range(W)}
        for i, d in enumerate(dests[r]):
            slots[d].append(i)
        for d in range(W):
            ranks[d].data[("counts", par, r)] = epoch
            yield
            ranks[d].flags[("count", par, r)] = epoch
            yield
        for d in range(W):
            for slot in range(len(slots[d])):
                ranks[d].data[("row", par, r, slot)] = epoch
                yield
                ranks[d].flags[("row", par, r, slot)] = epoch
                yield
        received = {}
        for s in range(W):
            yield from wait(r, ("count", par, s), epoch)
            read(("counts", par, s), epoch, "counts")
            received[s] = sum(1 for d in routing[n][s] if d == r)
            for slot in range(received[s]):
                yield from wait(r, ("row", par, s, slot), epoch)
                read(("row", par, s, slot), epoch, "row")
                yield
        # --- combine ------------------------------------------------------------------------
        for d in range(W):
            ranks[d].flags[("done", par, r)] = epoch
            yield
        for s in range(W):
            for slot in range(received[s]):
                ranks[s].data[("ret", par, r, slot)] = epoch
                yield
                ranks[s].flags[("ret", par, r, slot)] = epoch
                yield
        for d in range(W):
            for slot in range(len(slots[d])):
                yield from wait(r, ("ret", par, d, slot), epoch)
                read(("ret", par, d, slot), epoch, "returned row")
                yield
        if rules["done_wait"]:
            for d in range(W):
                yield from wait(r, ("done", par, d), epoch)


def run(world, steps, seed, rules=CORRECT, skew=0.0):
    """Interleaves every rank's program at random; returns None or the violation."""
    rng = random.Random(seed)
    routing = []
    for _ in range(steps):
        per_rank = []
        for r in range(world):
            tokens = rng.choice([0, 1, 2, 3])
            per_rank.append([rng.randrange(world) for _ in range(tokens)])
        routing.append(per_rank)
    ranks = [Rank() for _ in range(world)]
    programs = {r: step_programs(ranks, r, routing, rules) for r in range(world)}
    # a skewed scheduler: some ranks run much faster (the hazards need one rank ahead)
    weight = {r: (1.0 if rng.random() > skew else 0.05) for r in range(world)}
    spins = 0
    while programs:
        live = list(programs)
        r = rng.choices(live, weights=[weight[x] for x in live])[0]
        try:
            status = next(programs[r])
        except StopIteration:
            del programs[r]
            continue
        except Violation as exc:
            return str(exc)
        spins = spins + 1 if status == "wait" else 0
        if spins > 20000:
            return "deadlock: every rank spins"
    return None


@pytest.mark.parametrize("world", [2, 3, 4])
def test_protocol_holds_under_random_interleavings(world):
    for seed in range(150):
        problem = run(world, steps=6, seed=seed, skew=0.5 if seed % 2 else 0.0)
        assert problem is None, (seed, problem)


@pytest.mark.parametrize("rule", ["double_buffer", "done_wait"])
def test_either_guard_alone_keeps_a_peer_from_overwriting(rule):
    """The two guards against a peer running ahead are redundant on purpose: the count flags
    already make every dispatch a barrier (no rank finishes dispatch n + 1 before every peer
    has started it, hence finished step n), so parity alone suffices; the done flags alone
    (one buffer) suffice too. Either one alone passes the model."""
    rules = {**CORRECT, rule: False}
    for seed in range(150):
        problem = run(3 if seed % 3 == 0 else 2, steps=6, seed=seed, rules=rules,
                      skew=0.9 if seed % 2 else 0.3)
        assert problem is None, (seed, problem)


def test_without_both_guards_a_peer_overwrites():
    """Without parity and without the done flags, some interleaving reads counts or rows of
    another step: the model can find protocol errors."""
    rules = {**CORRECT, "double_buffer": False, "done_wait": False}
    found = [p for seed in range(400)
             if (p := run(2, steps=6, seed=seed, rules=rules, skew=0.9)) is not None]
    assert found and all("holds epoch" in p for p in found), found[:3]
