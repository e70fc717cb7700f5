"""One opened bundle used from several threads and streams at once, and on every visible GPU
(each device gets its own arch, SM count, modules and workspaces)."""

from __future__ import annotations

import threading

import pytest

from rose_aot import open_bundle

pytestmark = pytest.mark.gpu

H = 2048


@pytest.fixture(scope="module")
def bundle(shipped_bundle_path):
    return open_bundle(shipped_bundle_path)


def _expected(handle, x, res, w):
    xc, rc, wc = x.cpu(), res.cpu(), w.cpu()
    out = xc.clone()
    handle.family.reference(handle.config, xc, rc, wc, out)
    return out, rc


def test_eight_threads_on_their_own_streams(bundle):
    """8 threads x 200 launches each, fused add + norm (writes two tensors) and MoE dispatch +
    combine (workspaces per stream), all concurrently; every result checked."""
    import torch

    norm = bundle.kernel("rms_norm", hidden=H, eps=1e-6, fused_residual=True)
    dispatch = bundle.kernel("moe_dispatch", num_experts=128, top_k=8, hidden=H)
    combine = bundle.kernel("moe_combine", top_k=8, hidden=H)
    errors: list = []
    barrier = threading.Barrier(8)

    def worker(i):
        try:
            gen = torch.Generator(device="cuda").manual_seed(i)
            stream = torch.cuda.Stream()
            tokens = 1 + 37 * i
            with torch.cuda.stream(stream):
                x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=gen)
                res = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=gen)
                w = torch.rand(H, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
                ids = torch.argsort(torch.rand(tokens, 128, device="cuda", generator=gen), 1)[:, :8]
                ids = ids.int()
                topw = torch.ones(tokens, 8, device="cuda") / 8
                barrier.wait()
                for _ in range(200):
                    r = res.clone()
                    out = torch.empty_like(x)
                    norm(x, r, w, out)
                    routed = torch.empty(tokens * 8, H, device="cuda", dtype=torch.bfloat16)
                    offsets = torch.empty(129, device="cuda", dtype=torch.int32)
                    positions = torch.empty(tokens, 8, device="cuda", dtype=torch.int32)
                    dispatch(out, ids, routed, offsets, positions)
                    mean = torch.empty_like(out)
                    combine(routed, positions, topw, mean)
            stream.synchronize()
            want_out, want_res = _expected(norm, x, res, w)
            torch.testing.assert_close(r.cpu(), want_res, rtol=0, atol=0)
            torch.testing.assert_close(out.cpu().float(), want_out.float(), rtol=1e-2, atol=1e-2)
            # 8 copies of each token weighted 1/8 sum to the token exactly (fp32 accumulation)
            assert torch.equal(mean, out)
        except BaseException as exc:  # reported by the main thread
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_one_bundle_serves_every_gpu(bundle):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    norm = bundle.kernel("rms_norm", hidden=H, eps=1e-6)
    for device in range(torch.cuda.device_count()):
        with torch.cuda.device(device):
            x = torch.randn(300, H, device=f"cuda:{device}", dtype=torch.bfloat16)
            w = torch.rand(H, device=f"cuda:{device}", dtype=torch.bfloat16) + 0.5
            out = torch.full_like(x, float("nan"))
            norm(x, w, out)
            torch.cuda.synchronize(device)
            want = x.cpu().clone()
            norm.family.reference(norm.config, x.cpu(), w.cpu(), want)
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=1e-2, atol=1e-2)
            assert norm.record(device).variants  # each device resolved its own arch's record
            assert bundle.sm_count(device) == torch.cuda.get_device_properties(device).multi_processor_count


@pytest.mark.parametrize("threads", [1, 4])
def test_preload_on_threads_loads_every_kernel_that_then_runs(shipped_bundle_path, threads):
    """preload(threads=N): N - 1 helper threads verify the artifacts ahead while the calling
    thread loads them into the device's context; every entry of the device's arch is loaded
    once, the handles launch from those modules without loading anything more, and the result
    is the reference's."""
    import torch

    bundle = open_bundle(shipped_bundle_path)  # fresh: nothing loaded yet
    device = torch.cuda.current_device()
    arch = bundle.arch_for_device(device)
    want = sum(len(v.entries) for key in bundle.points(arch)
               for v in bundle.record(key, arch).variants)
    assert bundle.preload(device, threads=threads) == want
    assert sum(len(k) for (d, *_), k in bundle._device_kernels.items() if d == device) == want
    # Variants whose cubins are the same bytes (moe_combine's split and split_wide at top-8...)
    # share one module: the same functions (test_moe_gpu launches each and compares them).
    by_digest, variants = {}, 0
    for key in bundle.points(arch):
        for v in bundle.record(key, arch).variants:
            kernels = [int(k) for k in bundle._device_kernels[(device, key, arch, v.name)]]
            assert by_digest.setdefault(v.cubin_sha256, kernels) == kernels, (key, v.name)
            variants += 1
    assert len(by_digest) < variants
    assert {digest for d, digest in bundle._modules if d == device} == set(by_digest)
    _norm_runs_without_loading(bundle, threads)


def _norm_runs_without_loading(bundle, seed):
    import torch

    loaded = dict(bundle._device_kernels)
    norm = bundle.kernel("rms_norm", hidden=H, eps=1e-6, fused_residual=True)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for tokens in (1, 4096):  # the decode and the prefill variant
        x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        res = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.rand(H, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
        r, out = res.clone(), torch.empty_like(x)
        norm(x, r, w, out)
        torch.cuda.synchronize()
        want_out, want_res = _expected(norm, x, res, w)
        torch.testing.assert_close(r.cpu(), want_res, rtol=0, atol=0)
        torch.testing.assert_close(out.cpu().float(), want_out.float(), rtol=1e-2, atol=1e-2)
    assert bundle._device_kernels == loaded  # the launches loaded nothing more


def test_preload_refuses_a_device_it_does_not_have(shipped_bundle_path):
    """preload(device) names the devices there are, before anything is loaded."""
    import torch

    from rose_aot.errors import ArgumentError

    bundle = open_bundle(shipped_bundle_path)
    count = torch.cuda.device_count()
    for device in (count, -1, True, "0"):
        with pytest.raises(ArgumentError, match=rf"must be a CUDA device index in \[0, {count}\)"):
            bundle.preload(device)
    assert bundle._device_kernels == {}


def test_first_launch_from_a_thread_that_never_used_cuda(shipped_bundle_path):
    """The first launch loads the variant's module: in a thread with no CUDA context current
    yet (it made no runtime call; the tensors come from another thread), the loader makes the
    device's primary context current itself."""
    import torch

    bundle = open_bundle(shipped_bundle_path)  # fresh: nothing loaded yet
    norm = bundle.kernel("rms_norm", hidden=H, eps=1e-6, fused_residual=True)
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(3, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    res = torch.randn(3, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.rand(H, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
    r, out = res.clone(), torch.empty_like(x)
    torch.cuda.synchronize()
    errors: list = []

    def first_launch():
        try:
            norm(x, r, w, out)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=first_launch)
    thread.start()
    thread.join()
    assert not errors, errors
    torch.cuda.synchronize()
    want_out, want_res = _expected(norm, x, res, w)
    torch.testing.assert_close(r.cpu(), want_res, rtol=0, atol=0)
    torch.testing.assert_close(out.cpu().float(), want_out.float(), rtol=1e-2, atol=1e-2)


def test_preload_by_default_verifies_on_the_calling_thread(shipped_bundle_path, monkeypatch):
    """preload() without threads verifies and loads on the calling thread (PRELOAD_THREADS = 1:
    with the C cubin reader the helper no longer pays); threads=2 verifies on one helper. Both
    load every entry."""
    import torch

    from rose_aot.loader import runtime

    calls = []
    real = runtime._in_order

    def spy(work, tasks, helpers):
        calls.append((len(tasks), helpers))
        return real(work, tasks, helpers)

    monkeypatch.setattr(runtime, "_in_order", spy)
    device = torch.cuda.current_device()
    loaded = open_bundle(shipped_bundle_path).preload(device)
    assert runtime.PRELOAD_THREADS == 1 and calls[-1][1] == 0
    assert calls[-1][0] >= 32, "the shipped bundle is a large load"
    assert open_bundle(shipped_bundle_path).preload(device, threads=2) == loaded
    assert calls[-1][1] == 1
