"""A model check of the all_reduce cross-rank protocol (plain Python, no GPU).

The kernels cannot run here, and a protocol error on the GPU is a hang or a silently wrong sum.
This test executes the protocol of rose_aot/kernels/all_reduce/device.py step by step for
several ranks and blocks under many random interleavings: per-block epoch counters (block 0
also advancing the counters of blocks a call does not launch), double buffering by epoch
parity, release/acquire flags per (phase, source rank, block) compared with ">= epoch",
stream order between the calls of one rank, grids and variants changing from call to call.
It fails if a block reads peer data that is not the current call's (a peer overwrote it or
has not written it yet), or if no block can make progress (deadlock).
"""

from __future__ import annotations

import random

import pytest

MAX_BLOCKS = 8
ELEMENTS = 12

# The protocol as the kernels implement it; the negative tests turn one rule off at a time.
CORRECT = {"double_buffer": True, "flag_at_least": True, "advance_unlaunched": True}


class Rank:
    def __init__(self, world):
        self.counters = [0] * MAX_BLOCKS
        self.flags = {}  # (phase, src, block) -> last epoch stored there by src
        self.data = {}  # (parity, element) -> (call index, "staged" | "reduced")
        self.world = world


def block_program(ranks, r, b, grid, kind, call, world, rules=CORRECT):
    """Yields after every shared-memory step; raises AssertionError on a protocol violation.
    Mirrors the device code: one_shot_kernel / two_shot_kernel, cross_rank_barrier, finish."""
    me = ranks[r]
    epoch = me.counters[b] + 1
    parity = epoch & 1 if rules["double_buffer"] else 0
    mine = [j for j in range(ELEMENTS) if j % grid == b]
    for j in mine:  # stage
        me.data[(parity, j)] = (call, "staged")
        yield

    def barrier(phase):
        for p in range(world):  # thread p publishes to rank p
            if p != r:
                ranks[p].flags[(phase, r, b)] = epoch
                yield
        for p in range(world):  # thread p waits for rank p
            if p != r:
                if rules["flag_at_least"]:
                    while ranks[r].flags.get((phase, p, b), 0) - epoch < 0:
                        yield "wait"
                else:
                    while ranks[r].flags.get((phase, p, b), 0) != epoch:
                        yield "wait"

    yield from barrier(0)
    if kind == "one_shot":
        for j in mine:
            for p in range(world):
                got = ranks[p].data.get((parity, j))
                assert got == (call, "staged"), (
                    f"call {call} rank {r} block {b} read rank {p}'s element {j} as {got}")
                yield
    else:
        owner = {j: (j // grid) % world for j in mine}
        for j in mine:
            if owner[j] == r:
                for p in range(world):
                    got = ranks[p].data.get((parity, j))
                    assert got == (call, "staged") or (p == r and got == (call, "reduced")), (
                        f"call {call} rank {r} block {b} reduce read rank {p} element {j}: {got}")
                    yield
                me.data[(parity, j)] = (call, "reduced")
                yield
        yield from barrier(1)
        for j in mine:
            if owner[j] != r:
                got = ranks[owner[j]].data.get((parity, j))
                assert got == (call, "reduced"), (
                    f"call {call} rank {r} block {b} gather read rank {owner[j]} element {j}: {got}")
                yield
    me.counters[b] = epoch  # finish
    if b == 0 and rules["advance_unlaunched"]:
        for i in range(grid, MAX_BLOCKS):
            me.counters[i] = epoch
    yield


def simulate(world, calls, rng, rules=CORRECT):
    """Runs every rank's calls; each step runs a few steps of ONE random block, so any block
    can be delayed for a long time (a GPU gives no fairness between blocks of two devices)."""
    ranks = [Rank(world) for _ in range(world)]
    position = [0] * world  # next call per rank (stream order)
    running = {}  # (rank, block) -> generator of the rank's current call
    waiting = set()  # blocks whose last step was an unsuccessful wait, since the last progress
    steps = 0
    while True:
        for r in range(world):  # a call starts when the rank's previous call has finished
            if not any(k[0] == r for k in running) and position[r] < len(calls):
                kind, grid = calls[position[r]]
                for b in range(grid):
                    running[(r, b)] = block_program(ranks, r, b, grid, kind, position[r], world,
                                                    rules)
                position[r] += 1
                waiting.clear()
        if not running:
            return ranks
        if waiting >= set(running):
            raise AssertionError(f"deadlock: blocks {sorted(running)} all wait; "
                                 f"calls started per rank {position}")
        key = rng.choice(sorted(running))
        for _ in range(rng.randint(1, 4)):
            try:
                step = next(running[key])
            except StopIteration:
                del running[key]
                waiting.clear()
                break
            if step == "wait":
                waiting.add(key)
                break
            waiting.clear()
        steps += 1
        assert steps < 10**6, "no end"


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_protocol_under_random_interleavings(world):
    rng = random.Random(world)
    for _ in range(150 if world < 8 else 40):
        calls = [(rng.choice(["one_shot", "two_shot"]), rng.randint(1, MAX_BLOCKS))
                 for _ in range(rng.randint(1, 9))]
        ranks = simulate(world, calls, rng)
        for rank in ranks:  # every counter holds the number of calls, for every block
            assert rank.counters == [len(calls)] * MAX_BLOCKS


@pytest.mark.parametrize(
    "broken, symptom",
    [
        # one buffer: a fast rank restages while a slow peer still reads the last call
        ("double_buffer", "read rank"),
        # "== epoch": a peer already one call ahead overwrote the flag: the wait never ends
        ("flag_at_least", "deadlock"),
        # a block first launched by a later, larger grid starts from an old epoch
        ("advance_unlaunched", "deadlock|read rank"),
    ],
)
def test_the_model_catches_each_broken_rule(broken, symptom):
    """Each rule is necessary: turning it off must be caught, or the model proves nothing."""
    rules = {**CORRECT, broken: False}
    rng = random.Random(11)
    with pytest.raises(AssertionError, match=symptom):
        for _ in range(500):
            calls = [(rng.choice(["one_shot", "two_shot"]), rng.randint(1, MAX_BLOCKS))
                     for _ in range(rng.randint(2, 9))]
            simulate(2, calls, rng, rules)
