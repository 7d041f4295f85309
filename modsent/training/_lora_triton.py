"""The Triton kernels of :mod:`modsent.training.lora_kernels` (imported on first use: only
where Triton is installed)."""

import triton
import triton.language as tl

@triton.jit
def keep_tile(seed, rows, k0, groups_per_row, threshold, G: tl.constexpr):
    """The keep mask (int8, 1 = kept) of rows ``rows`` and columns ``k0 .. k0 + 8G`` (``k0`` a
    multiple of 8): one Philox call (four 32-bit draws, eight 16-bit halves) per row and group of
    8 columns. Element (row, c) takes a half, fixed by c % 8, of the call at offset
    row·groups_per_row + c // 8: every element of a matrix gets its own draw, whatever the tile."""
    g = tl.arange(0, G)
    offset = rows[:, None].to(tl.int64) * groups_per_row + (k0 // 8 + g)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, offset)
    r0 = r0.to(tl.uint32, bitcast=True)
    r1 = r1.to(tl.uint32, bitcast=True)
    r2 = r2.to(tl.uint32, bitcast=True)
    r3 = r3.to(tl.uint32, bitcast=True)
    k_0 = ((r0 & 0xFFFF) >= threshold).to(tl.int8)
    k_1 = ((r0 >> 16) >= threshold).to(tl.int8)
    k_2 = ((r1 & 0xFFFF) >= threshold).to(tl.int8)
    k_3 = ((r1 >> 16) >= threshold).to(tl.int8)
    k_4 = ((r2 & 0xFFFF) >= threshold).to(tl.int8)
    k_5 = ((r2 >> 16) >= threshold).to(tl.int8)
    k_6 = ((r3 & 0xFFFF) >= threshold).to(tl.int8)
    k_7 = ((r3 >> 16) >= threshold).to(tl.int8)
    both = tl.join(tl.join(tl.join(k_0, k_1), tl.join(k_2, k_3)),
                   tl.join(tl.join(k_4, k_5), tl.join(k_6, k_7)))
    return tl.reshape(both, (rows.shape[0], 8 * G))

@triton.jit
def mask_kernel(OUT, M, seed, groups_per_row, threshold, K: tl.constexpr,
                G: tl.constexpr, BM: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        keep = keep_tile(seed, rows, k0, groups_per_row, threshold, G)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        tl.store(OUT + rows[:, None].to(tl.int64) * K + cols[None, :], keep, mask=inside)

@triton.jit
def down_kernel(X, A, H, M, R, stride_x, seed, groups_per_row, threshold, scale, K: tl.constexpr,
                G: tl.constexpr, BM: tl.constexpr, RP: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr):
    """H[rows] = (mask · X[rows] · scale) @ A^T, A of shape (R, K), H (M, R)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rank = tl.arange(0, RP)
    acc = tl.zeros((BM, RP), dtype=tl.float32)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=inside, other=0.0)
        keep = keep_tile(seed, rows, k0, groups_per_row, threshold, G)
        xm = tl.where(keep != 0, x.to(tl.float32) * scale, 0.0).to(x.dtype)
        a = tl.load(A + rank[None, :] * K + cols[:, None], mask=(rank[None, :] < R) & (cols[:, None] < K),
                    other=0.0)
        if UPCAST:
            acc += tl.dot(xm.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
        else:
            acc += tl.dot(xm, a, input_precision=PRECISION)
    tl.store(H + rows[:, None].to(tl.int64) * R + rank[None, :], acc.to(H.dtype.element_ty),
             mask=(rows[:, None] < M) & (rank[None, :] < R))

@triton.jit
def up_kernel(GX, X, U, A, PART, M, R, stride_x, stride_gx, seed, groups_per_row, threshold, scale,
              K: tl.constexpr, BLOCKS: tl.constexpr, UPDATE: tl.constexpr, G: tl.constexpr, BM: tl.constexpr,
              RP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """For this program's row blocks: GX += mask · (U @ A) · scale (U = s · g @ B, of shape
    (M, R)) where UPDATE, and PART[program] = U^T @ (mask · X · scale), of shape (R, K)."""
    program = tl.program_id(0)
    rank = tl.arange(0, RP)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        a = tl.load(A + rank[:, None] * K + cols[None, :], mask=(rank[:, None] < R) & (cols[None, :] < K),
                    other=0.0)
        acc = tl.zeros((RP, 8 * G), dtype=tl.float32)
        for block in range(0, BLOCKS):
            rows = (program * BLOCKS + block) * BM + tl.arange(0, BM)
            inside = (rows[:, None] < M) & (cols[None, :] < K)
            u = tl.load(U + rows[:, None].to(tl.int64) * R + rank[None, :],
                        mask=(rows[:, None] < M) & (rank[None, :] < R), other=0.0)
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=inside, other=0.0)
            keep = keep_tile(seed, rows, k0, groups_per_row, threshold, G) != 0
            xm = tl.where(keep, x.to(tl.float32) * scale, 0.0).to(x.dtype)
            if UPCAST:
                acc += tl.dot(tl.trans(u.to(tl.float32)), xm.to(tl.float32), input_precision=PRECISION)
            else:
                acc += tl.dot(tl.trans(u), xm, input_precision=PRECISION)
            if UPDATE:
                pointers = GX + rows[:, None].to(tl.int64) * stride_gx + cols[None, :]
                gx = tl.load(pointers, mask=inside, other=0.0)
                if UPCAST:
                    ua = tl.dot(u.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
                else:
                    ua = tl.dot(u, a, input_precision=PRECISION)
                gx = gx.to(tl.float32) + tl.where(keep, ua * scale, 0.0)
                tl.store(pointers, gx.to(GX.dtype.element_ty), mask=inside)
        tl.store(PART + program.to(tl.int64) * R * K + rank[:, None] * K + cols[None, :], acc,
                 mask=(rank[:, None] < R) & (cols[None, :] < K))
