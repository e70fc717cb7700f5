"""Warmup: open_bundle checks the records and leaves each artifact's decompression and check to
its first load, which verifies it before the driver sees a byte; preload may do that on threads.

Real bundles (the tiny session build, two archs); no GPU. Where a test needs to see what a load
hands the driver, it records the driver's load calls instead of making them: it shows what
would be handed over, never that a kernel runs.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rose_aot.bundle import BundleReader
from rose_aot.cli import main as cli
from rose_aot.errors import ArgumentError, BundleError
from rose_aot.loader import KernelBundle, driver, open_bundle

from fixtures_tiny import rewrite_bundle


def _rms_point(index: dict, arch: str, fused: str = "false") -> dict:
    return next(p for p in index["points"] if p["family"] == "rms_norm" and p["arch"] == arch
                and f"fused_residual={fused}" in p["key"])


def _qk_point(index: dict, arch: str) -> dict:
    return next(p for p in index["points"] if p["family"] == "qk_norm" and p["arch"] == arch)


def _swap_cubins(index: dict, arch: str) -> None:
    """The decode and prefill cubins of the qk_norm point swapped, the record digests with them:
    the index is consistent, only the record check of the cubin can tell (by the block it was
    compiled for: one warp for decode, four for prefill; rms_norm's two-warp rows of hidden 1024
    decode and prefill in the same 4-warp block)."""
    point = _qk_point(index, arch)
    decode, prefill = (next(v for v in point["variants"] if v["name"] == n)
                       for n in ("decode", "prefill"))
    assert decode["block"] != prefill["block"]
    for field in ("cubin", "cubin_sha256"):
        decode[field], prefill[field] = prefill[field], decode[field]


@pytest.fixture
def recorded_loads(monkeypatch):
    """The images the loader would hand cuModuleLoadData, in order."""
    images = []

    def load_module(image, what):
        images.append(bytes(image))
        return object()

    monkeypatch.setattr(driver, "load_module", load_module)
    monkeypatch.setattr(driver, "module_function", lambda module, name: name)
    return images


def test_open_decompresses_no_artifact(tiny_build, monkeypatch):
    """Opening reads the index only; checking one arch's artifacts decompresses exactly that
    arch's cubins (a point of another arch costs nothing)."""
    asked = []
    real = BundleReader.blob_view  # what a load reads a cubin with
    monkeypatch.setattr(BundleReader, "blob_view",
                        lambda self, name: asked.append(name) or real(self, name))
    bundle = open_bundle(tiny_build.path)
    assert asked == []
    assert bundle.check_artifacts("sm_90a") == len(asked) > 0
    cubins = sorted(v["cubin"] for (k, a), p in bundle._points.items() if a == "sm_90a"
                    for v in p["variants"])
    assert sorted(asked) == cubins
    assert KernelBundle(BundleReader.open(tiny_build.path)).check_artifacts() > len(cubins)


def test_open_reads_no_record_and_a_device_reads_only_its_archs(tiny_build, monkeypatch):
    """open_bundle checks configs and keys only; the first device of an arch reads and checks
    that arch's records (all of them, once), never another arch's."""
    import torch

    from rose_aot.kernels.record import PointRecord

    read = []
    real = PointRecord.from_json.__func__
    monkeypatch.setattr(PointRecord, "from_json", classmethod(
        lambda cls, data, memo=None: read.append((data["key"], data["arch"])) or real(cls, data, memo)))
    bundle = open_bundle(tiny_build.path)
    handles = [bundle.handle(key) for key in bundle.points()]
    assert read == [] and bundle._archs_checked == set()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert bundle.arch_for_device(0) == "sm_90a"
    ours = [(p["key"], p["arch"]) for p in bundle.index["points"] if p["arch"] == "sm_90a"]
    assert read == ours and bundle._archs_checked == {"sm_90a"}
    assert bundle.arch_for_device(0) == "sm_90a" and bundle.record(*ours[0]) is not None
    assert [h.arg_names for h in handles] and read == ours  # from the checked arch's records
    bundle.check_records()  # every arch, as verify does: the others now, sm_90a not again
    assert sorted(read) == sorted((p["key"], p["arch"]) for p in bundle.index["points"])
    with pytest.raises(ArgumentError, match="check_records"):
        bundle.check_records(90)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "SM_90A", ""])
def test_an_arch_the_bundle_lacks_is_an_argument_error_not_nothing_to_check(tiny_build, arch):
    """check_records / check_artifacts / record with an arch the bundle was not built for (a
    typo) say so and name the bundle's archs, instead of checking nothing and returning 0."""
    from rose_aot.errors import KernelNotFoundError

    bundle = open_bundle(tiny_build.path)
    uses = (lambda: bundle.check_records(arch), lambda: bundle.check_artifacts(arch),
            lambda: bundle.record(bundle.points()[0], arch))
    for use in uses:
        with pytest.raises(ArgumentError, match=r"built for sm_100a, sm_90a"):
            use()
    assert bundle._archs_checked == set()
    key = bundle.points("sm_90a")[0]
    assert bundle.record(key, "sm_90a").variants
    with pytest.raises(KernelNotFoundError, match="no kernel rms_norm.nope"):
        bundle.record("rms_norm.nope", "sm_90a")


def test_record_of_a_key_or_arch_that_is_not_a_string_says_so(tiny_build):
    """record(key, None) said the bundle has the point "for ['sm_100a', 'sm_90a'] only" (the
    arch was missing, not the point), and a non-str key ended in a bare TypeError."""
    bundle = open_bundle(tiny_build.path)
    key = bundle.points("sm_90a")[0]
    with pytest.raises(ArgumentError, match=r"the arch is a name such as 'sm_90a' \(this bundle: "
                                            r"sm_100a, sm_90a\), got NoneType None"):
        bundle.record(key, None)
    for bad in ([key], None, b"rms_norm", 3):
        with pytest.raises(ArgumentError, match=r"record\(\): a point key is a string"):
            bundle.record(bad, "sm_90a")
    assert bundle._archs_checked == set()  # refused before anything was checked


def test_a_cubin_that_does_not_match_its_record_never_reaches_the_driver(
    tiny_build, tmp_path, recorded_loads
):
    bad = rewrite_bundle(tiny_build.path, tmp_path / "swapped.rosebundle",
                         edit_index=lambda index: _swap_cubins(index, "sm_100a"))
    bundle = open_bundle(bad)  # the records are fine; the swapped cubin is not loaded yet
    key = _qk_point(bundle.index, "sm_100a")["key"]
    assert key in bundle.points("sm_100a")
    bundle.check_artifacts("sm_90a")  # the other arch loads

    with pytest.raises(BundleError) as first_load:
        bundle._load_kernels(0, key, "sm_100a", "decode")
    message = str(first_load.value)
    assert message.startswith(f"{bad}: {key} on sm_100a: the cubin of variant decode does not "
                              "match its record (")
    assert "misplaced or damaged" in message and "rose-aot build" in message
    assert recorded_loads == [], "an unverified cubin reached the driver"
    with pytest.raises(BundleError) as again:  # never marked as checked
        bundle.verified_image(key, "sm_100a", "decode")
    assert str(again.value) == message

    # rose-aot verify and the eager KernelBundle refuse the file with the same words.
    with pytest.raises(BundleError) as eager:
        KernelBundle(BundleReader.open(bad))
    assert str(eager.value) == message
    result = CliRunner().invoke(cli, ["verify", str(bad)])
    assert result.exit_code == 1 and "does not match its record" in result.output

    # A good variant hands the driver exactly its verified cubin.
    good = _rms_point(bundle.index, "sm_90a")
    kernels = bundle._load_kernels(0, good["key"], "sm_90a", "decode")
    variant = next(v for v in good["variants"] if v["name"] == "decode")
    assert recorded_loads == [bundle.reader.blob(variant["cubin"])]
    assert kernels == variant["entries"]


@pytest.mark.parametrize("threads", [1, 2, 4, 16])
def test_check_artifacts_raises_the_first_error_in_point_order(tiny_build, tmp_path, threads):
    def break_two(index):
        _swap_cubins(index, "sm_90a")
        _swap_cubins(index, "sm_100a")

    bad = rewrite_bundle(tiny_build.path, tmp_path / "two.rosebundle", edit_index=break_two)
    first = min(_qk_point(open_bundle(bad).index, arch)["key"] + "@" + arch
                for arch in ("sm_90a", "sm_100a"))
    key, arch = first.split("@")
    for _ in range(5):  # whichever thread gets there first
        with pytest.raises(BundleError, match=rf"{key.replace('(', '.').replace(')', '.')} on "
                                              rf"{arch}: the cubin of variant decode"):
            open_bundle(bad).check_artifacts(threads=threads)
    assert open_bundle(tiny_build.path).check_artifacts(threads=threads) > 0


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "4"])
def test_preload_threads_must_be_a_positive_int(tiny_build, threads):
    with pytest.raises(ArgumentError, match="threads must be a positive int"):
        open_bundle(tiny_build.path).preload(threads=threads)


def test_a_handle_takes_the_config_checked_at_open(tiny_build, monkeypatch):
    """handle(key) builds its handle from the family and config that open converted and
    checked against the key: no second conversion of the index's config per point. Lookups
    by config fields (kernel()) still convert what the caller passed."""
    from rose_aot.errors import KernelNotFoundError
    from rose_aot.kernels import get_family

    bundle = open_bundle(tiny_build.path)
    conversions = []
    for family in {p["family"] for p in bundle.index["points"]}:
        fam = get_family(family)
        real = fam.make_config
        monkeypatch.setattr(fam, "make_config",
                            lambda real=real, **values: conversions.append(values) or real(**values))
    keys = bundle.points()
    handles = [bundle.handle(key) for key in keys]
    assert conversions == []
    for key, handle in zip(keys, handles):
        point = next(p for p in bundle.index["points"] if p["key"] == key)
        assert handle.key == key and bundle.handle(key) is handle
        assert handle.config == get_family(point["family"]).make_config(**point["config"])
        assert set(handle._archs) == {p["arch"] for p in bundle.index["points"]
                                      if p["key"] == key}
    conversions.clear()
    point = bundle.index["points"][0]
    assert bundle.kernel(point["family"], **point["config"]).key == point["key"]
    assert conversions == [point["config"]]
    with pytest.raises(KernelNotFoundError):
        bundle.handle("rms_norm(hidden=3)")


@pytest.mark.parametrize("helpers", [0, 1, 3])
def test_in_order_yields_each_outcome_in_task_order(helpers):
    """preload's pipeline: helpers work ahead (in whatever order they finish), the caller gets
    each outcome in task order, a failure in its place and the tasks after it still done."""
    import threading
    import time

    from rose_aot.loader.runtime import _in_order

    ran_on = {}

    def work(i, delay):
        time.sleep(delay)
        ran_on[i] = threading.current_thread().name
        if i == 3:
            raise ValueError("task 3")
        return i * 10

    tasks = [(i, 0.004 if i % 2 == 0 else 0.0) for i in range(8)]
    out = list(_in_order(work, tasks, helpers))
    assert [ok for ok, _ in out] == [True, True, True, False, True, True, True, True]
    assert [r for ok, r in out if ok] == [0, 10, 20, 40, 50, 60, 70]
    assert str(out[3][1]) == "task 3"
    names = set(ran_on.values())
    if helpers:
        assert names and all(n.startswith("rose-aot verify") for n in names)
        assert len(names) <= helpers
    else:
        assert names == {threading.current_thread().name}
    assert not [t for t in threading.enumerate() if t.name.startswith("rose-aot verify")]


@pytest.mark.parametrize("helpers, lookahead", [(1, 1), (2, 3), (3, 8)])
def test_in_order_helpers_run_at_most_lookahead_tasks_ahead_of_the_caller(helpers, lookahead):
    """Each started task holds a result (for preload, a verified image) until the caller takes
    it: with a slow caller, the helpers never start more than `lookahead` tasks past the
    outcomes taken, and every outcome still arrives in order."""
    import threading
    import time

    from rose_aot.loader.runtime import _in_order

    started = []
    taken = [0]
    ahead = []
    lock = threading.Lock()

    def work(i):
        with lock:
            started.append(i)
            ahead.append(len(started) - taken[0])
        return i

    tasks = [(i,) for i in range(40)]
    out = []
    for ok, result in _in_order(work, tasks, helpers, lookahead):
        with lock:
            taken[0] += 1
        assert ok
        out.append(result)
        time.sleep(0.001)  # the driver's part: slower than the helpers' work
    assert out == list(range(40))
    assert max(ahead) <= lookahead
    assert max(ahead) == lookahead or helpers == 1 and lookahead == 1  # it does run ahead
    assert not [t for t in threading.enumerate() if t.name.startswith("rose-aot verify")]


def test_in_order_closed_early_starts_no_more_work():
    """A caller that stops at the first failure (check_artifacts) closes the pipeline: the
    helpers finish what they hold, start nothing more, and are gone when close returns."""
    import threading
    import time
    from contextlib import closing

    from rose_aot.loader.runtime import _in_order

    started = []

    def work(i):
        started.append(i)
        time.sleep(0.002)
        if i == 1:
            raise ValueError("stop here")
        return i

    tasks = [(i,) for i in range(200)]
    with closing(_in_order(work, tasks, 2)) as outcomes:
        first_error = next(exc for ok, exc in outcomes if not ok)
    assert str(first_error) == "stop here"
    count = len(started)
    time.sleep(0.02)
    assert len(started) == count < 20  # nothing started after close
    assert not [t for t in threading.enumerate() if t.name.startswith("rose-aot verify")]


def test_a_device_of_an_arch_with_a_bad_record_is_refused_at_every_use(tiny_build, tmp_path,
                                                                       monkeypatch):
    """The first device of an arch checks its records: a bad one is a BundleError there, at
    that device's every later use too (its arch is not remembered), and a handle made before
    fails the same way at its launch checks; the bundle's other arch is not affected."""
    import torch

    def drop(index):
        point = _rms_point(index, "sm_90a")
        del point["variants"][0]["constants"]["rows_per_block"]

    bad = rewrite_bundle(tiny_build.path, tmp_path / "bad90.rosebundle", edit_index=drop)
    bundle = open_bundle(bad)
    handle = bundle.handle(_rms_point(bundle.index, "sm_90a")["key"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    for use in (lambda: bundle.arch_for_device(0), lambda: bundle.arch_for_device(0),
                lambda: handle.record(0)):
        with pytest.raises(BundleError, match="launch plan does not understand the record"):
            use()
    assert 0 not in bundle._device_arch and bundle._archs_checked == set()
    bundle.check_records("sm_100a")
    assert bundle._archs_checked == {"sm_100a"}


def test_variants_with_the_same_image_share_one_module(shipped_build, recorded_loads):
    """Variants whose cubins are the same bytes (moe_combine's split and split_wide at top-8,
    the routing kernel of two FP8 dispatch points) load one module per device; each variant
    still gets its own entries, and each cubin is checked against each record."""
    bundle = open_bundle(shipped_build.path)
    tasks = bundle._variants("sm_90a")
    digests = {bundle.record(k, a).variant(v).cubin_sha256 for k, a, v in tasks}
    assert len(digests) < len(tasks), "the shipped manifests have no shared image any more"
    for task in tasks:
        entries = bundle.record(task[0], task[1]).variant(task[2]).entries
        assert bundle._load_kernels(0, *task) == list(entries)
    assert len(recorded_loads) == len(set(recorded_loads)) == len(digests)
    assert bundle._cubins_checked >= set(tasks)
