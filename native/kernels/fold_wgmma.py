"""The folded FP8 GEMM for Hopper written in Gluon (Triton's explicit-layout dialect): TMA
loads by a producer warp, two warpgroups of wgmma consumers, each with its own 64 rows of a
128 x BN tile (issue 17).

The sums are those of ``fold.folded_gemm_kernel`` (and so of ``emulator.fold.folded_matmul``)
for the same group and promotion, because each element's arithmetic is the same sequence:

- PROMOTE (method ``fp8_exact``, ``HOPPER_FP8_EXACT``): each K = 32 slice of a stage is one
  wgmma into a fresh partial sum (exact: 32 products of folded E4M3 operands, so each output's
  partial is the same whatever the instruction's N: LOOKAHEAD splits it into column halves or
  quarters), the partials added to the group sum in float32 in K order, as the Triton
  kernel's ``tl.dot(a, b, zeros, max_num_imprecise_acc=32)`` does (Triton lowers that into
  the same K = 32 wgmmas and adds); the group's first partial is written into the
  group sum itself (0 + p is p up to a zero's sign, which acc + T cannot see: acc starts at
  +0 and never becomes -0 under round to nearest).
- chained (method ``fp8``, ``HOPPER_FP8_CHAINED``): the group's wgmmas accumulate into one
  another in the tensor core (no ``max_num_imprecise_acc``: Hopper's default for FP8 is
  never to promote), from a zero sum.
- per group: acc += (T * 2^ea) * 2^eb, two rounded products then a rounded add, only where
  every group exponent of both operands lies in +-RANK1_EXP (``fold.folded_gemm_kernel``'s
  RANK1 epilogue); there both products are exact, so the promoted form computes it as one
  fused multiply-add (``_rank1_add``). A launch with a wide operand computes through the
  general form (``_wide_scaled``, the exponents read back from the 2^R floats) with WIDE
  (``native.fold.WGMMA_WIDE``, on by default; checked on an H200), or without it nothing
  here and the Triton kernel's RANK1=False launch does the whole GEMM.
  The groups' 2^ea and 2^eb come group-major (one row of M or N floats a group) through TMA
  with the group's last K step, so the epilogue never waits on a global load.

Why two warpgroups, and LOOKAHEAD: with promotion every 32 of K, the float32 adds of a partial
sum take about as long as the wgmma that made it (a 64 x BN partial: 64 BN adds over 128
lanes, against 2 * 64 * BN * 32 flops at 8192 flops a clock), so the tensor cores can stay busy
only while one warpgroup adds and the other's wgmma runs. The promoted form runs at about half
that bound (results/native_gpu/fold_wgmma_h200.md section 4), and the measurements there point
at the latency from a wgmma to the adds that wait for it, not at the adds' count: a third
fewer float32 operations (``_rank1_add``) gained 1.5%; making the warpgroups take turns at the
tensor cores through barriers lost 30% (removed); keeping a wgmma of the same warpgroup in
flight while it adds (LOOKAHEAD 1, ``_lookahead_partition``, column halves) gained 4%.
LOOKAHEAD 2 (``_quarter_partition``: column quarters, two in flight) compiles without spills
and has not run on a GPU yet. The chained form adds once per group and is bound by the
tensor cores.

GPU-only: Gluon has no interpreter. On CPU the module imports and compiles for sm_90
(``tests/test_fold.py``); the bits are checked on an H100/H200 against the Triton kernel.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

HALF_M = gl.constexpr(64)  # rows of one warpgroup's wgmma tile
# Triton 3.6 (the GPU host's) and 3.9 (CI's) name three things differently: the TMA copies
# (async_copy_global_to_shared, async_copy_shared_to_global / async_load, async_store) and a
# partition's barrier (thread_barrier / barrier); each is bound here for the Triton installed
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _ordered_add(x, y):
    """x + y in float32 (round to nearest), kept in program order among the wgmmas: as a plain
    add, LLVM sinks it past the next wgmma, which then needs fresh registers for its partial
    sum (four partial sums live at once: spills)."""
    return gl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [x, y],
                                     dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _pow2(e):
    """2^e as float32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _exponent(s):
    """R from s = 2^R as float32, R in [-149, 127] (the fold's group exponents, -133 .. 121
    for E2M1, are all there, subnormal 2^R included; a NaN s is flagged by the caller): the
    biased exponent field, or for a subnormal the field of its bits converted to float."""
    u = s.to(gl.int32, bitcast=True) & 0x7FFFFFFF
    biased = u >> 23
    sub = (u.to(gl.float32).to(gl.int32, bitcast=True) >> 23) - 276  # - 127 - 149
    return gl.where(biased == 0, sub, biased - 127)


@gluon.jit
def _wide_scaled(t, sa, sb):
    """T 2^(R_a + R_b) as the Triton kernel's general epilogue (``fold._group_scale``) rounds
    it, for any group exponents: (T * 2^e1) * 2^e2 with e1 the sum clamped to +-100 and e2
    the rest clamped to [-126, 127]; NaN where either group holds a NaN block."""
    e = _exponent(sa)[:, None] + _exponent(sb)[None, :]
    e1 = gl.minimum(gl.maximum(e, -100), 100)
    e2 = gl.minimum(gl.maximum(e - e1, -126), 127)
    nan = (sa != sa)[:, None] | (sb != sb)[None, :]
    return (t * gl.where(nan, float("nan"), _pow2(e1))) * _pow2(e2)


@gluon.jit
def _rank1_add(acc, t, sa, sb, FUSED: gl.constexpr):
    """acc + (T * 2^ea) * 2^eb, both products exact, as one fused multiply-add: acc + T * s
    with s = 2^(ea + eb) built from the bits of sa = 2^ea and sb = 2^eb by one integer add
    per element. The same bits as the three rounded operations, for |ea|, |eb| <= RANK1_EXP
    and groups of at most 32 blocks (``native.fold.WGMMA_MAX_GROUP``): T is 0 or a multiple
    of 2^-18 below 2^27.7 (at most 1024 E4M3 products, each at most 448^2 < 2^17.7), so T * s
    is 0 or a normal float32 within 2^-118 .. 2^127.7, never rounded, and the add's rounding
    is the one rounding either way. It leaves one float32 operation of the three (the scale's
    product moves to the integer pipe; the exponent bias comes off the per-row vector once a
    group): +1.5% for the promoted form on an H200 (module doc: not its bound). Only where
    FUSED (the promoted form, an epilogue per 4 wgmmas); the chained form's epilogue, once per
    group of up to 32 blocks, keeps the three operations (fewer registers live)."""
    if not FUSED:
        return acc + (t * sa[:, None]) * sb[None, :]
    ia = sa.to(gl.int32, bitcast=True) - (127 << 23)
    ib = sb.to(gl.int32, bitcast=True)
    s = (ia[:, None] + ib[None, :]).to(gl.float32, bitcast=True)
    return gl.fma(t, s, acc)


@gluon.jit
def _tile_offsets(tile, M, N, BN: gl.constexpr, GROUP_M: gl.constexpr):
    """(first row, first column) of output tile ``tile``, the tiles ordered in bands of
    GROUP_M tile rows (the programs working at once share their A and B tiles in L2)."""
    BM: gl.constexpr = 2 * HALF_M
    num_n = gl.cdiv(N, BN)
    band = GROUP_M * num_n
    first_m = (tile // band) * GROUP_M
    size_m = gl.minimum(gl.cdiv(M, BM) - first_m, GROUP_M)
    return (first_m + (tile % band) % size_m) * BM, ((tile % band) // size_m) * BN


@gluon.jit
def _load_partition(a_desc, b_desc, pa_desc, pb_desc, a_bufs, b_bufs, pa_bufs, pb_bufs, ready,
                    empty, M, N, n_tiles, n_groups, STEPS: gl.constexpr, BK: gl.constexpr,
                    BN: gl.constexpr, GROUP_M: gl.constexpr):
    """The producer warp: for each of this program's tiles, each K step's A (128 rows) and B
    (BN rows) tiles into the next free stage, and with a group's last step the group's 2^ea and
    2^eb (group-major float32, one row of ``pa``/``pb`` a group), the stage's ``ready`` barrier
    told the bytes to expect."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    scale_bytes: gl.constexpr = pa_desc.block_type.nbytes + pb_desc.block_type.nbytes
    i = 0  # K steps loaded so far (every tile's)
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BN, GROUP_M)
        for g in range(n_groups):
            for s in gl.static_range(STEPS):
                stage = i % STAGES
                mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)  # consumers done
                bar = ready.index(stage)
                if s == STEPS - 1:
                    mbarrier.expect(bar, tile_bytes + scale_bytes)
                    _tma_load(pa_desc, [g * M + off_m], bar, pa_bufs.index(stage))
                    _tma_load(pb_desc, [g * N + off_n], bar, pb_bufs.index(stage))
                else:
                    mbarrier.expect(bar, tile_bytes)
                k = (g * STEPS + s) * BK
                _tma_load(a_desc, [off_m, k], bar, a_bufs.index(stage))
                _tma_load(b_desc, [off_n, k], bar, b_bufs.index(stage))
                i += 1


@gluon.jit
def _mma_partition(a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc, c_bufs, M,
                   N, n_tiles, n_groups, wide, HALF: gl.constexpr, GROUP: gl.constexpr,
                   BN: gl.constexpr, BK: gl.constexpr, PROMOTE: gl.constexpr,
                   OUT_BF16: gl.constexpr, GROUP_M: gl.constexpr, WIDE: gl.constexpr):
    """One consumer warpgroup: for each of this program's tiles, rows 64 HALF .. + 64 of it:
    every group's dot, its scaled sum, the store through shared memory and TMA (rows and
    columns past M and N are not written), which completes under the next tile's K loop."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    STEPS: gl.constexpr = GROUP * 32 // BK  # K steps a group
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BN, 32])
    t = gl.zeros([HALF_M, BN], gl.float32, layout)  # a group's sum
    p = gl.zeros([HALF_M, BN], gl.float32, layout)  # a partial sum (PROMOTE)
    c_smem = c_bufs.index(HALF)
    i = 0  # K steps consumed so far (every tile's)
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BN, GROUP_M)
        acc = gl.zeros([HALF_M, BN], gl.float32, layout)
        for g in range(n_groups):
            for s in gl.static_range(STEPS):
                stage = i % STAGES
                mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
                a = a_bufs.index(stage).slice(HALF * HALF_M, HALF_M)
                b = b_bufs.index(stage).permute((1, 0))
                if PROMOTE:  # each K = 32 wgmma into a fresh partial sum, added in K order;
                    for j in gl.static_range(BK // 32):  # each wgmma writes over a dead value
                        aj = a.slice(32 * j, 32, dim=1)
                        bj = b.slice(32 * j, 32, dim=0)
                        if s == 0 and j == 0:  # 0 + p is p but for a zero's sign, which
                            t = warpgroup_mma(aj, bj, t, use_acc=False)  # acc + T cannot see
                        else:
                            p = warpgroup_mma(aj, bj, p, use_acc=False)
                            t = _ordered_add(t, p)
                else:  # chained; one wgmma in flight while the next stage is awaited
                    t = warpgroup_mma(a, b, t, use_acc=s > 0, is_async=True)
                    if s > 0:
                        t = warpgroup_mma_wait(1, deps=(t,))
                        mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
                    if s == STEPS - 1:
                        t = warpgroup_mma_wait(0, deps=(t,))
                if s == STEPS - 1:  # the group's 2^ea, 2^eb came with its last step
                    sa = pa_bufs.index(stage).slice(HALF * HALF_M, HALF_M).load(
                        gl.SliceLayout(1, layout))
                    sb = pb_bufs.index(stage).load(gl.SliceLayout(0, layout))
                if PROMOTE and s < STEPS - 1:  # (Triton puts a partition barrier before the
                    mbarrier.arrive(empty.index(stage), count=1)  # one thread's arrive)
                i += 1
            # acc + (T 2^ea) 2^eb: T 2^ea exact where every exponent lies in +-fold.RANK1_EXP
            # (its comment), then the product's one rounding and the add's (_rank1_add; the
            # launch sets enable_fp_fusion=False, so no contraction but its explicit one); a
            # wide launch (WIDE) the general form, the same bits for any exponents
            if WIDE:
                if wide != 0:
                    acc = acc + _wide_scaled(t, sa, sb)
                else:
                    acc = _rank1_add(acc, t, sa, sb, PROMOTE)
            else:
                acc = _rank1_add(acc, t, sa, sb, PROMOTE)
            # the group's last stage goes back only now that its 2^ea, 2^eb have been used: an
            # arrive between their shared-memory loads and the values' first use let the next
            # TMA write overtake the loads (an H200, WIDE on: the epilogue's branch had moved
            # every use past the arrive; benchmarks/fold_wgmma_stress.py)
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
        tma.store_wait(pendings=0)  # the last tile's store has left c_smem (the thread that
        _partition_barrier()  # issued it waited; the barrier holds the others until it has)
        _store(acc, c_smem, OUT_BF16)
        _tma_store(c_desc, [off_m + HALF * HALF_M, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _store(acc, c_smem, OUT_BF16: gl.constexpr):
    """acc into shared memory for a TMA store: float32, or bf16 (as int16) rounded to nearest
    even on the bits (NaN kept quiet)."""
    if OUT_BF16:
        u = acc.to(gl.int32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = gl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, r)
        c_smem.store(r.to(gl.int16))
    else:
        c_smem.store(acc)
    fence_async_shared()


@gluon.jit
def _lookahead_partition(a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc, c_bufs, M, N,
                         n_tiles, n_groups, wide, HALF: gl.constexpr, GROUP: gl.constexpr,
                         BN: gl.constexpr, BK: gl.constexpr, OUT_BF16: gl.constexpr,
                         GROUP_M: gl.constexpr, WIDE: gl.constexpr):
    """``_mma_partition``'s promoted form (the same sums, the same bits) with LOOKAHEAD:
    each K = 32 slice as two wgmmas, one per column half of the tile (64 x BN/2 each), and
    each left in flight while the partial before it is added: issue the slice's left half
    into p, wait for the previous slice's right half (q) and add it, issue the right half into
    q, wait for p and add it. A group's first slice goes into its sums t0, t1 themselves. The
    registers: accumulators, group sums and partials of 64 x BN/2 each, as many as the plain
    form's three tiles of 64 x BN. The C tile goes out as its two halves (C boxes of
    [64, BN/2]). Each output's K = 32 dot is exact in either form (module doc), so splitting
    the instruction's N cannot change a partial sum."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    STEPS: gl.constexpr = GROUP * 32 // BK  # K steps a group
    NH: gl.constexpr = BN // 2
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, NH, 32])
    t0 = gl.zeros([HALF_M, NH], gl.float32, layout)  # a group's sums (left, right half)
    t1 = gl.zeros([HALF_M, NH], gl.float32, layout)
    p = gl.zeros([HALF_M, NH], gl.float32, layout)  # a slice's partial sums
    q = gl.zeros([HALF_M, NH], gl.float32, layout)
    i = 0  # K steps consumed so far (every tile's)
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BN, GROUP_M)
        acc0 = gl.zeros([HALF_M, NH], gl.float32, layout)
        acc1 = gl.zeros([HALF_M, NH], gl.float32, layout)
        for g in range(n_groups):
            for s in gl.static_range(STEPS):
                stage = i % STAGES
                mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
                a = a_bufs.index(stage).slice(HALF * HALF_M, HALF_M)
                b0 = b_bufs.index(stage).slice(0, NH).permute((1, 0))
                b1 = b_bufs.index(stage).slice(NH, NH).permute((1, 0))
                for j in gl.static_range(BK // 32):
                    aj = a.slice(32 * j, 32, dim=1)
                    b0j = b0.slice(32 * j, 32, dim=0)
                    b1j = b1.slice(32 * j, 32, dim=0)
                    if s == 0 and j == 0:
                        t0 = warpgroup_mma(aj, b0j, t0, use_acc=False, is_async=True)
                        t1 = warpgroup_mma(aj, b1j, t1, use_acc=False, is_async=True)
                    else:
                        p = warpgroup_mma(aj, b0j, p, use_acc=False, is_async=True)
                        if s == 0 and j == 1:  # the first slice's: the sums themselves
                            t0, t1 = warpgroup_mma_wait(1, deps=(t0, t1))
                        else:  # the previous slice's right half
                            q = warpgroup_mma_wait(1, deps=(q,))
                            t1 = _ordered_add(t1, q)
                        if j == 0:  # the previous stage's last slice is done
                            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
                        q = warpgroup_mma(aj, b1j, q, use_acc=False, is_async=True)
                        p = warpgroup_mma_wait(1, deps=(p,))
                        t0 = _ordered_add(t0, p)
                i += 1
            q = warpgroup_mma_wait(0, deps=(q,))  # the group's last right half
            t1 = _ordered_add(t1, q)
            stage = (i - 1) % STAGES  # the group's 2^ea, 2^eb came with its last step
            sa = pa_bufs.index(stage).slice(HALF * HALF_M, HALF_M).load(gl.SliceLayout(1, layout))
            sb0 = pb_bufs.index(stage).slice(0, NH).load(gl.SliceLayout(0, layout))
            sb1 = pb_bufs.index(stage).slice(NH, NH).load(gl.SliceLayout(0, layout))
            if WIDE:
                if wide != 0:
                    acc0 = acc0 + _wide_scaled(t0, sa, sb0)
                    acc1 = acc1 + _wide_scaled(t1, sa, sb1)
                else:
                    acc0 = _rank1_add(acc0, t0, sa, sb0, True)
                    acc1 = _rank1_add(acc1, t1, sa, sb1, True)
            else:
                acc0 = _rank1_add(acc0, t0, sa, sb0, True)
                acc1 = _rank1_add(acc1, t1, sa, sb1, True)
            mbarrier.arrive(empty.index(stage), count=1)  # (2^ea, 2^eb used: _mma_partition)
        tma.store_wait(pendings=0)  # the last tile's stores have left c_bufs
        _partition_barrier()
        _store(acc0, c_bufs.index(2 * HALF), OUT_BF16)
        _tma_store(c_desc, [off_m + HALF * HALF_M, off_n], c_bufs.index(2 * HALF))
        _store(acc1, c_bufs.index(2 * HALF + 1), OUT_BF16)
        _tma_store(c_desc, [off_m + HALF * HALF_M, off_n + NH], c_bufs.index(2 * HALF + 1))
    tma.store_wait(pendings=0)


@gluon.jit
def _quarter_partition(a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc, c_bufs, M, N,
                       n_tiles, n_groups, wide, HALF: gl.constexpr, GROUP: gl.constexpr,
                       BN: gl.constexpr, BK: gl.constexpr, OUT_BF16: gl.constexpr,
                       GROUP_M: gl.constexpr, WIDE: gl.constexpr):
    """``_lookahead_partition`` over column quarters with two wgmmas in flight (LOOKAHEAD = 2;
    the same sums, the same bits): each K = 32 slice as four wgmmas of 64 x BN/4, units
    u = 4 (slice) + quarter in K order; after issuing unit u, wait for unit u - 2 and add its
    partial to its quarter's group sum, so two wgmmas run while one partial is added. A
    group's first slice goes into the sums t0 .. t3 themselves; later units into the partials
    p0, p1, p2 in turn (unit u into p[u % 3], free again once unit u - 3 has been added). The
    registers: four accumulators, four group sums and three partials of 64 x BN/4, fewer than
    the plain form's three tiles of 64 x BN. C goes out as its four quarters."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    STEPS: gl.constexpr = GROUP * 32 // BK  # K steps a group
    NQ: gl.constexpr = BN // 4
    UNITS: gl.constexpr = (BK // 32) * 4  # wgmmas a K step
    LAST: gl.constexpr = STEPS * UNITS - 1  # a group's last unit
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, NQ, 32])
    t0 = gl.zeros([HALF_M, NQ], gl.float32, layout)  # a group's sums, one per quarter
    t1 = gl.zeros([HALF_M, NQ], gl.float32, layout)
    t2 = gl.zeros([HALF_M, NQ], gl.float32, layout)
    t3 = gl.zeros([HALF_M, NQ], gl.float32, layout)
    p0 = gl.zeros([HALF_M, NQ], gl.float32, layout)  # partial sums, in turn
    p1 = gl.zeros([HALF_M, NQ], gl.float32, layout)
    p2 = gl.zeros([HALF_M, NQ], gl.float32, layout)
    i = 0  # K steps consumed so far (every tile's)
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BN, GROUP_M)
        acc0 = gl.zeros([HALF_M, NQ], gl.float32, layout)
        acc1 = gl.zeros([HALF_M, NQ], gl.float32, layout)
        acc2 = gl.zeros([HALF_M, NQ], gl.float32, layout)
        acc3 = gl.zeros([HALF_M, NQ], gl.float32, layout)
        for g in range(n_groups):
            for s in gl.static_range(STEPS):
                stage = i % STAGES
                mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
                a = a_bufs.index(stage).slice(HALF * HALF_M, HALF_M)
                for j in gl.static_range(BK // 32):
                    aj = a.slice(32 * j, 32, dim=1)
                    for h in gl.static_range(4):
                        bj = b_bufs.index(stage).slice(h * NQ, NQ).permute((1, 0)).slice(
                            32 * j, 32, dim=0)
                        # unit u = (s (BK // 32) + j) 4 + h, written out in each
                        # condition: a name assigned an int is a tensor to Triton (dynamic ifs)
                        if s == 0 and j == 0:  # the group's first slice: into its sums
                            if h == 0:
                                t0 = warpgroup_mma(aj, bj, t0, use_acc=False, is_async=True)
                            elif h == 1:
                                t1 = warpgroup_mma(aj, bj, t1, use_acc=False, is_async=True)
                            elif h == 2:
                                t2 = warpgroup_mma(aj, bj, t2, use_acc=False, is_async=True)
                            else:
                                t3 = warpgroup_mma(aj, bj, t3, use_acc=False, is_async=True)
                        elif ((s * (BK // 32) + j) * 4 + h) % 3 == 0:
                            p0 = warpgroup_mma(aj, bj, p0, use_acc=False, is_async=True)
                        elif ((s * (BK // 32) + j) * 4 + h) % 3 == 1:
                            p1 = warpgroup_mma(aj, bj, p1, use_acc=False, is_async=True)
                        else:
                            p2 = warpgroup_mma(aj, bj, p2, use_acc=False, is_async=True)
                        if (s * (BK // 32) + j) * 4 + h >= 2:  # unit u - 2 is done (in
                            t0, t1, t2, t3, p0, p1, p2 = _unit_done(  # order), its partial added
                                (s * (BK // 32) + j) * 4 + h - 2, 2, t0, t1, t2, t3, p0, p1, p2)
                            if ((s * (BK // 32) + j) * 4 + h) % UNITS == 1:  # u - 2: the last
                                mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)  # unit
                                # of the previous stage
                i += 1
            t0, t1, t2, t3, p0, p1, p2 = _unit_done(LAST - 1, 1, t0, t1, t2, t3, p0, p1, p2)
            t0, t1, t2, t3, p0, p1, p2 = _unit_done(LAST, 0, t0, t1, t2, t3, p0, p1, p2)
            stage = (i - 1) % STAGES  # the group's 2^ea, 2^eb came with its last step
            sa = pa_bufs.index(stage).slice(HALF * HALF_M, HALF_M).load(gl.SliceLayout(1, layout))
            sb0 = pb_bufs.index(stage).slice(0, NQ).load(gl.SliceLayout(0, layout))
            sb1 = pb_bufs.index(stage).slice(NQ, NQ).load(gl.SliceLayout(0, layout))
            sb2 = pb_bufs.index(stage).slice(2 * NQ, NQ).load(gl.SliceLayout(0, layout))
            sb3 = pb_bufs.index(stage).slice(3 * NQ, NQ).load(gl.SliceLayout(0, layout))
            if WIDE:
                if wide != 0:
                    acc0 = acc0 + _wide_scaled(t0, sa, sb0)
                    acc1 = acc1 + _wide_scaled(t1, sa, sb1)
                    acc2 = acc2 + _wide_scaled(t2, sa, sb2)
                    acc3 = acc3 + _wide_scaled(t3, sa, sb3)
                else:
                    acc0 = _rank1_add(acc0, t0, sa, sb0, True)
                    acc1 = _rank1_add(acc1, t1, sa, sb1, True)
                    acc2 = _rank1_add(acc2, t2, sa, sb2, True)
                    acc3 = _rank1_add(acc3, t3, sa, sb3, True)
            else:
                acc0 = _rank1_add(acc0, t0, sa, sb0, True)
                acc1 = _rank1_add(acc1, t1, sa, sb1, True)
                acc2 = _rank1_add(acc2, t2, sa, sb2, True)
                acc3 = _rank1_add(acc3, t3, sa, sb3, True)
            mbarrier.arrive(empty.index(stage), count=1)  # (2^ea, 2^eb used: _mma_partition)
        tma.store_wait(pendings=0)  # the last tile's stores have left c_bufs
        _partition_barrier()
        row = off_m + HALF * HALF_M
        _store(acc0, c_bufs.index(4 * HALF), OUT_BF16)
        _tma_store(c_desc, [row, off_n], c_bufs.index(4 * HALF))
        _store(acc1, c_bufs.index(4 * HALF + 1), OUT_BF16)
        _tma_store(c_desc, [row, off_n + NQ], c_bufs.index(4 * HALF + 1))
        _store(acc2, c_bufs.index(4 * HALF + 2), OUT_BF16)
        _tma_store(c_desc, [row, off_n + 2 * NQ], c_bufs.index(4 * HALF + 2))
        _store(acc3, c_bufs.index(4 * HALF + 3), OUT_BF16)
        _tma_store(c_desc, [row, off_n + 3 * NQ], c_bufs.index(4 * HALF + 3))
    tma.store_wait(pendings=0)


@gluon.jit
def _unit_done(v: gl.constexpr, PENDING: gl.constexpr, t0, t1, t2, t3, p0, p1, p2):
    """``_quarter_partition``'s unit v done (a wait that leaves PENDING later wgmmas in
    flight), and its partial added to its quarter's sum (the first slice's units, v < 4,
    wrote the sums themselves)."""
    if v < 4:
        if v == 0:
            t0 = warpgroup_mma_wait(PENDING, deps=(t0,))
        elif v == 1:
            t1 = warpgroup_mma_wait(PENDING, deps=(t1,))
        elif v == 2:
            t2 = warpgroup_mma_wait(PENDING, deps=(t2,))
        else:
            t3 = warpgroup_mma_wait(PENDING, deps=(t3,))
    else:
        if v % 3 == 0:
            p0 = warpgroup_mma_wait(PENDING, deps=(p0,))
            x = p0
        elif v % 3 == 1:
            p1 = warpgroup_mma_wait(PENDING, deps=(p1,))
            x = p1
        else:
            p2 = warpgroup_mma_wait(PENDING, deps=(p2,))
            x = p2
        if v % 4 == 0:
            t0 = _ordered_add(t0, x)
        elif v % 4 == 1:
            t1 = _ordered_add(t1, x)
        elif v % 4 == 2:
            t2 = _ordered_add(t2, x)
        else:
            t3 = _ordered_add(t3, x)
    return t0, t1, t2, t3, p0, p1, p2


@gluon.jit
def folded_gemm_wgmma_kernel(a_desc, b_desc, c_desc, pa_desc, pb_desc, wide_a_ptr, wide_b_ptr,
                             M, N, K, GROUP: gl.constexpr, BN: gl.constexpr,
                             BK: gl.constexpr, STAGES: gl.constexpr, PROMOTE: gl.constexpr,
                             OUT_BF16: gl.constexpr, GROUP_M: gl.constexpr,
                             WIDE: gl.constexpr = False, LOOKAHEAD: gl.constexpr = 0):
    """C[M, N] = A Bᵀ of folded operands (module doc), persistent (a program per SM walks the
    output tiles): A (M, K) and B (N, K) E4M3 through TMA descriptors of [128, BK] and
    [BN, BK] boxes, C (float32, or bf16 as int16) through one of [64, BN] (promoted with
    LOOKAHEAD 1: [64, BN/2]; 2: [64, BN/4]), the groups' 2^ea and 2^eb as flat group-major
    float32 (K / 32 GROUP groups of M, of N) through boxes of [128] and [BN]. Computes only
    where neither operand is wide, or with WIDE every launch (a wide one through the general
    epilogue)."""
    n_tiles = gl.cdiv(M, 2 * HALF_M) * gl.cdiv(N, BN)
    wide = gl.load(wide_a_ptr) | gl.load(wide_b_ptr)
    if not WIDE:
        n_tiles = gl.where(wide == 0, n_tiles, 0)  # a wide launch computes nothing here
    n_groups = K // (32 * GROUP)
    gl.static_assert(GROUP <= 32, "groups of at most 32 blocks (_rank1_add's exactness)")
    gl.static_assert(BK % 64 == 0, "K steps of whole pairs of K = 32 slices (LOOKAHEAD)")

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    pa_bufs = gl.allocate_shared_memory(pa_desc.dtype, [STAGES] + pa_desc.block_type.shape,
                                        pa_desc.layout)
    pb_bufs = gl.allocate_shared_memory(pb_desc.dtype, [STAGES] + pb_desc.block_type.shape,
                                        pb_desc.layout)
    # a C box per warpgroup and column part: 2^LOOKAHEAD parts (the host passes 0 unless
    # PROMOTE), each its own box of [64, BN >> LOOKAHEAD]
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 << LOOKAHEAD] + c_desc.block_type.shape,
                                       c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release a stage
    STEPS: gl.constexpr = GROUP * 32 // BK
    if PROMOTE and LOOKAHEAD == 2:
        gl.warp_specialize([
            (_quarter_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc,
                                  c_bufs, M, N, n_tiles, n_groups, wide, 0, GROUP, BN, BK,
                                  OUT_BF16, GROUP_M, WIDE)),
            (_quarter_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc,
                                  c_bufs, M, N, n_tiles, n_groups, wide, 1, GROUP, BN, BK,
                                  OUT_BF16, GROUP_M, WIDE)),
            (_load_partition, (a_desc, b_desc, pa_desc, pb_desc, a_bufs, b_bufs, pa_bufs,
                               pb_bufs, ready, empty, M, N, n_tiles, n_groups, STEPS, BK, BN,
                               GROUP_M))], [4, 1], [232, 40])
    elif PROMOTE and LOOKAHEAD:
        gl.warp_specialize([
            (_lookahead_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc,
                                    c_bufs, M, N, n_tiles, n_groups, wide, 0, GROUP, BN, BK,
                                    OUT_BF16, GROUP_M, WIDE)),
            (_lookahead_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc,
                                    c_bufs, M, N, n_tiles, n_groups, wide, 1, GROUP, BN, BK,
                                    OUT_BF16, GROUP_M, WIDE)),
            (_load_partition, (a_desc, b_desc, pa_desc, pb_desc, a_bufs, b_bufs, pa_bufs,
                               pb_bufs, ready, empty, M, N, n_tiles, n_groups, STEPS, BK, BN,
                               GROUP_M))], [4, 1], [232, 40])
    else:
        gl.warp_specialize([
            (_mma_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc, c_bufs,
                              M, N, n_tiles, n_groups, wide, 0, GROUP, BN, BK, PROMOTE, OUT_BF16,
                              GROUP_M, WIDE)),
            (_mma_partition, (a_bufs, b_bufs, pa_bufs, pb_bufs, ready, empty, c_desc, c_bufs,
                              M, N, n_tiles, n_groups, wide, 1, GROUP, BN, BK, PROMOTE, OUT_BF16,
                              GROUP_M, WIDE)),
            (_load_partition, (a_desc, b_desc, pa_desc, pb_desc, a_bufs, b_bufs, pa_bufs,
                               pb_bufs, ready, empty, M, N, n_tiles, n_groups, STEPS, BK, BN,
                               GROUP_M))], [4, 1], [232, 40])
