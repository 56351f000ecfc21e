"""The folded FP8 GEMM for Hopper written in Gluon (Triton's explicit-layout dialect): TMA
loads by a producer warp, two warpgroups of wgmma consumers, each with its own 64 rows of a
128 x BN tile (issue 17).

The sums are those of ``fold.folded_gemm_kernel`` (and so of ``emulator.fold.folded_matmul``)
for the same group and promotion, because each element's arithmetic is the same sequence:

- PROMOTE (method ``fp8_exact``, ``HOPPER_FP8_EXACT``): a group's dot is one
  ``warpgroup_mma`` per 128 of K with ``max_num_imprecise_acc=32``, which Triton lowers into K
  = 32 wgmmas, each into a zeroed partial sum, each partial added to the group sum in K order;
  the group sum starts at zero, as ``tl.dot(a, b, zeros, max_num_imprecise_acc=32)``'s does.
- chained (method ``fp8``, ``HOPPER_FP8_CHAINED``): the group's wgmmas accumulate into one
  another in the tensor core (no ``max_num_imprecise_acc``: Hopper's default for FP8 is
  never to promote), from a zero sum.
- per group: acc += (T * 2^ea) * 2^eb, two rounded products then a rounded add (the launch
  sets ``enable_fp_fusion=False``), only where every group exponent of both operands lies in
  +-RANK1_EXP (``fold.folded_gemm_kernel``'s RANK1 epilogue); a launch with a wide operand
  computes nothing here and the Triton kernel's RANK1=False launch does the whole GEMM.

Why two warpgroups that never wait for each other: with promotion every 32 of K, the float32
adds of a partial sum take as long as the wgmma that made it (a 64 x BN partial: 64 BN adds
over 128 lanes, against 2 * 64 * BN * 32 flops at 8192 flops a clock). While one warpgroup
adds, the other's wgmma keeps the tensor cores busy; the warp scheduler interleaves them.

GPU-only: Gluon has no interpreter. On CPU the module imports and compiles for sm_90
(``tests/test_fold.py``); the bits are checked on an H100/H200 against the Triton kernel.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma)

RANK1_EXP = gl.constexpr(50)  # the same bound as fold.RANK1_EXP (a test keeps them equal)
HALF_M = gl.constexpr(64)  # rows of one warpgroup's wgmma tile


@gluon.jit
def _pow2(e):
    """2^e as float32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _ordered_add(x, y):
    """x + y in float32 (round to nearest), kept in program order among the wgmmas: as a plain
    add, LLVM sinks it past the next wgmma, which then needs fresh registers for its partial
    sum (four partial sums live at once: spills)."""
    return gl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [x, y],
                                     dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, n_steps,
                    BK: gl.constexpr):
    """The producer warp: each K step's A (128 rows) and B (BN rows) tiles into the next free
    stage, the stage's ``ready`` barrier told the bytes to expect."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    for i in range(n_steps):
        stage = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(empty.index(stage), phase ^ 1)  # both consumers are done with it
        bar = ready.index(stage)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BK], bar, a_bufs.index(stage))
        tma.async_copy_global_to_shared(b_desc, [off_n, i * BK], bar, b_bufs.index(stage))


@gluon.jit
def _exponent_scales(e_ptr, first, n, n_groups, g, N: gl.constexpr, layout: gl.constexpr):
    """2^e of group g for rows first .. first + N of an exponent array (rows, n_groups), loaded
    one row a thread and moved into ``layout`` (a slice of the wgmma layout): a thread of the
    wgmma layout holds 32 of a tile's columns, and their 64-bit addresses, kept across the K
    loop, spilled."""
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    r = first + gl.arange(0, N, layout=flat)
    e = gl.load(e_ptr + r * n_groups + g, mask=r < n, other=0)
    return gl.convert_layout(_pow2(e), layout)


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, ea_ptr, eb_ptr, M, N,
                   n_groups, off_m, off_n, HALF: gl.constexpr, GROUP: gl.constexpr,
                   BN: gl.constexpr, BK: gl.constexpr, PROMOTE: gl.constexpr,
                   OUT_BF16: gl.constexpr):
    """One consumer warpgroup: rows off_m + 64 HALF .. + 64 of the tile, every group's dot,
    its scaled sum, the store through shared memory and TMA (rows and columns past M and N
    are not written)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    STEPS: gl.constexpr = GROUP * 32 // BK  # K steps a group
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BN, 32])
    first = off_m + HALF * HALF_M
    acc = gl.zeros([HALF_M, BN], gl.float32, layout)
    t = gl.zeros([HALF_M, BN], gl.float32, layout)  # a group's sum
    p = gl.zeros([HALF_M, BN], gl.float32, layout)  # a partial sum (PROMOTE)
    for g in range(n_groups):
        for s in gl.static_range(STEPS):
            i = g * STEPS + s
            stage = i % STAGES
            mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
            a = a_bufs.index(stage).slice(HALF * HALF_M, HALF_M)
            b = b_bufs.index(stage).permute((1, 0))
            if PROMOTE:  # each K = 32 wgmma into a fresh partial sum, added in K order; each
                for j in gl.static_range(BK // 32):  # wgmma writes over a dead value's registers
                    aj = a.slice(32 * j, 32, dim=1)
                    bj = b.slice(32 * j, 32, dim=0)
                    if s == 0 and j == 0:  # 0 + p is p but for a zero's sign, which
                        t = warpgroup_mma(aj, bj, t, use_acc=False)  # acc + T cannot see
                    else:
                        p = warpgroup_mma(aj, bj, p, use_acc=False)
                        t = _ordered_add(t, p)
            else:
                t = warpgroup_mma(a, b, t, use_acc=s > 0)
            mbarrier.arrive(empty.index(stage), count=1)
        sa = _exponent_scales(ea_ptr, first, M, n_groups, g, HALF_M, gl.SliceLayout(1, layout))
        sb = _exponent_scales(eb_ptr, off_n, N, n_groups, g, BN, gl.SliceLayout(0, layout))
        acc = acc + (t * sa[:, None]) * sb[None, :]
    c_smem = c_bufs.index(HALF)
    if OUT_BF16:  # the bf16 output viewed as int16; round to nearest even on the bits
        u = acc.to(gl.int32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = gl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, r)
        c_smem.store(r.to(gl.int16))
    else:
        c_smem.store(acc)
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [first, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def folded_gemm_wgmma_kernel(a_desc, b_desc, c_desc, ea_ptr, eb_ptr, wide_a_ptr, wide_b_ptr,
                             M, N, K, GROUP: gl.constexpr, BN: gl.constexpr,
                             BK: gl.constexpr, STAGES: gl.constexpr, PROMOTE: gl.constexpr,
                             OUT_BF16: gl.constexpr, GROUP_M: gl.constexpr):
    """C[M, N] = A Bᵀ of folded operands (module doc): A (M, K) and B (N, K) E4M3 through TMA
    descriptors of [128, BK] and [BN, BK] boxes, C (float32, or bf16 as int16) through one of
    [64, BN], group exponents ea (M, K / 32 GROUP) and
    eb (N, K / 32 GROUP) int32. Computes only where neither operand is wide."""
    BM: gl.constexpr = 2 * HALF_M
    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    band = GROUP_M * num_n  # tile rows in bands of GROUP_M: neighbours share tiles in L2
    first_m = (pid // band) * GROUP_M
    size_m = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % band) % size_m) * BM
    off_n = ((pid % band) // size_m) * BN
    wide = gl.load(wide_a_ptr) | gl.load(wide_b_ptr)
    n_groups = gl.where(wide == 0, K // (32 * GROUP), 0)  # a wide launch computes nothing

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release a stage
    n_steps = n_groups * (GROUP * 32 // BK)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, ea_ptr, eb_ptr, M, N, n_groups,
                          off_m, off_n, 0, GROUP, BN, BK, PROMOTE, OUT_BF16)),
        (_mma_partition, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, ea_ptr, eb_ptr, M, N, n_groups,
                          off_m, off_n, 1, GROUP, BN, BK, PROMOTE, OUT_BF16)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n,
                           n_steps, BK)),
    ], [4, 1], [232, 40])
