"""The Triton kernels of :mod:`modsent.training.kernels` (imported on first use: only
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


@triton.jit(do_not_specialize=["seed", "threshold"])  # a new seed every call: no recompiling
def mask_kernel(OUT, M, seed, groups_per_row, threshold, K: tl.constexpr,
                G: tl.constexpr, BM: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        keep = keep_tile(seed, rows, k0, groups_per_row, threshold, G)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        tl.store(OUT + rows[:, None].to(tl.int64) * K + cols[None, :], keep, mask=inside)


@triton.jit
def masked_dot(x, keep, scale, a, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """(keep · x · scale) @ a in fp32, the masked tile rounded to x's dtype first (as eager dropout
    writes its output); x · 0 keeps a NaN, as eager dropout does."""
    xm = (x.to(tl.float32) * (keep.to(tl.float32) * scale)).to(x.dtype)
    if UPCAST:
        return tl.dot(xm.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
    return tl.dot(xm, a, input_precision=PRECISION)


@triton.jit(do_not_specialize=["seed", "seed1", "seed2", "threshold"])  # a new seed every call: no recompiling
def down_kernel(X, A, H, M, stride_x, seed, groups_per_row, threshold, scale, A1, H1, seed1, A2, H2, seed2,
                K: tl.constexpr, R: tl.constexpr, N: tl.constexpr, G: tl.constexpr, BM: tl.constexpr,
                RP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """H[rows] = (mask · X[rows] · scale) @ A^T, A of shape (R, K), H (M, R); with N = 2 or 3
    adapters reading the one X (an attention's query, key and value), the same for (A1, H1, seed1)
    and (A2, H2, seed2), each with its own mask, from one read of X."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rank = tl.arange(0, RP)
    acc = tl.zeros((BM, RP), dtype=tl.float32)
    acc1 = tl.zeros((BM, RP), dtype=tl.float32)
    acc2 = tl.zeros((BM, RP), dtype=tl.float32)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=inside, other=0.0)
        a_offsets = rank[None, :] * K + cols[:, None]
        a_inside = (rank[None, :] < R) & (cols[:, None] < K)
        keep = keep_tile(seed, rows, k0, groups_per_row, threshold, G)
        acc += masked_dot(x, keep, scale, tl.load(A + a_offsets, mask=a_inside, other=0.0), UPCAST, PRECISION)
        if N > 1:
            keep1 = keep_tile(seed1, rows, k0, groups_per_row, threshold, G)
            acc1 += masked_dot(x, keep1, scale, tl.load(A1 + a_offsets, mask=a_inside, other=0.0), UPCAST, PRECISION)
        if N > 2:
            keep2 = keep_tile(seed2, rows, k0, groups_per_row, threshold, G)
            acc2 += masked_dot(x, keep2, scale, tl.load(A2 + a_offsets, mask=a_inside, other=0.0), UPCAST, PRECISION)
    h_offsets = rows[:, None].to(tl.int64) * R + rank[None, :]
    h_inside = (rows[:, None] < M) & (rank[None, :] < R)
    tl.store(H + h_offsets, acc.to(H.dtype.element_ty), mask=h_inside)
    if N > 1:
        tl.store(H1 + h_offsets, acc1.to(H1.dtype.element_ty), mask=h_inside)
    if N > 2:
        tl.store(H2 + h_offsets, acc2.to(H2.dtype.element_ty), mask=h_inside)


@triton.jit
def part_dot(u, x, kept, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """u^T @ (x · kept), the masked tile rounded to x's dtype first, in fp32."""
    xm = (x.to(tl.float32) * kept).to(x.dtype)
    if UPCAST:
        return tl.dot(tl.trans(u.to(tl.float32)), xm.to(tl.float32), input_precision=PRECISION)
    return tl.dot(tl.trans(u), xm, input_precision=PRECISION)


@triton.jit
def branch_dot(u, a, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """u @ a in fp32."""
    if UPCAST:
        return tl.dot(u.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
    return tl.dot(u, a, input_precision=PRECISION)


@triton.jit(do_not_specialize=["seed", "seed1", "seed2", "threshold"])  # a new seed every call: no recompiling
def up_kernel(GX, X, U, A, PART, M, stride_x, stride_gx, seed, groups_per_row, threshold, scale,
              U1, A1, PART1, seed1, U2, A2, PART2, seed2,
              K: tl.constexpr, R: tl.constexpr, N: tl.constexpr, BLOCKS: tl.constexpr, UPDATE: tl.constexpr,
              WANT_A: tl.constexpr, G: tl.constexpr, BM: tl.constexpr,
              RP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """For this program's row blocks: GX += mask · (U @ A) · scale (U = s · g @ B, of shape
    (M, R)) where UPDATE, and PART[program] = U^T @ (mask · X · scale), of shape (R, K), where WANT_A;
    with N = 2 or 3 adapters reading the one X, GX takes the sum of their masked branches in the
    one pass, and (U1, A1, PART1, seed1), (U2, A2, PART2, seed2) give theirs as the first."""
    program = tl.program_id(0)
    rank = tl.arange(0, RP)
    for k0 in range(0, K, 8 * G):
        cols = k0 + tl.arange(0, 8 * G)
        a_offsets = rank[:, None] * K + cols[None, :]
        a_inside = (rank[:, None] < R) & (cols[None, :] < K)
        a = tl.load(A + a_offsets, mask=a_inside, other=0.0)
        acc = tl.zeros((RP, 8 * G), dtype=tl.float32)
        if N > 1:
            a1 = tl.load(A1 + a_offsets, mask=a_inside, other=0.0)
            acc1 = tl.zeros((RP, 8 * G), dtype=tl.float32)
        if N > 2:
            a2 = tl.load(A2 + a_offsets, mask=a_inside, other=0.0)
            acc2 = tl.zeros((RP, 8 * G), dtype=tl.float32)
        for block in range(0, BLOCKS):
            rows = (program * BLOCKS + block) * BM + tl.arange(0, BM)
            inside = (rows[:, None] < M) & (cols[None, :] < K)
            u_offsets = rows[:, None].to(tl.int64) * R + rank[None, :]
            u_inside = (rows[:, None] < M) & (rank[None, :] < R)
            u = tl.load(U + u_offsets, mask=u_inside, other=0.0)
            kept = keep_tile(seed, rows, k0, groups_per_row, threshold, G).to(tl.float32) * scale
            if N > 1:
                u1 = tl.load(U1 + u_offsets, mask=u_inside, other=0.0)
                kept1 = keep_tile(seed1, rows, k0, groups_per_row, threshold, G).to(tl.float32) * scale
            if N > 2:
                u2 = tl.load(U2 + u_offsets, mask=u_inside, other=0.0)
                kept2 = keep_tile(seed2, rows, k0, groups_per_row, threshold, G).to(tl.float32) * scale
            if WANT_A:
                x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=inside, other=0.0)
                acc += part_dot(u, x, kept, UPCAST, PRECISION)
                if N > 1:
                    acc1 += part_dot(u1, x, kept1, UPCAST, PRECISION)
                if N > 2:
                    acc2 += part_dot(u2, x, kept2, UPCAST, PRECISION)
            if UPDATE:
                pointers = GX + rows[:, None].to(tl.int64) * stride_gx + cols[None, :]
                gx = tl.load(pointers, mask=inside, other=0.0).to(tl.float32)
                gx += branch_dot(u, a, UPCAST, PRECISION) * kept
                if N > 1:
                    gx += branch_dot(u1, a1, UPCAST, PRECISION) * kept1
                if N > 2:
                    gx += branch_dot(u2, a2, UPCAST, PRECISION) * kept2
                tl.store(pointers, gx.to(GX.dtype.element_ty), mask=inside)
        if WANT_A:
            part_offsets = program.to(tl.int64) * R * K + a_offsets
            tl.store(PART + part_offsets, acc, mask=a_inside)
            if N > 1:
                tl.store(PART1 + part_offsets, acc1, mask=a_inside)
            if N > 2:
                tl.store(PART2 + part_offsets, acc2, mask=a_inside)


@triton.jit(do_not_specialize=["seed", "threshold"])  # a new seed every call: no recompiling
def norm_forward_kernel(H, R, W, B, Y, S, MEAN, RSTD, M, stride_h, stride_r, seed, groups_per_row, threshold, scale, eps,
                        D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                        DROP: tl.constexpr):
    """Y = LayerNorm(dropout(H) + R) over rows of width D (BD: D rounded up to a power of 2),
    computed as eager PyTorch rounds it: the dropout's output in H's dtype, the sum in S's (kept
    for the backward, with each row's mean and 1/std), the norm in fp32 from it, Y in its dtype."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    inside = (rows[:, None] < M) & (cols[None, :] < D)
    h = tl.load(H + rows[:, None].to(tl.int64) * stride_h + cols[None, :], mask=inside, other=0.0)
    r = tl.load(R + rows[:, None].to(tl.int64) * stride_r + cols[None, :], mask=inside, other=0.0)
    if DROP:
        kept = keep_tile(seed, rows, 0, groups_per_row, threshold, BD // 8).to(tl.float32) * scale
        h = (h.to(tl.float32) * kept).to(h.dtype)
    s = (h.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
    x = tl.where(inside, s.to(tl.float32), 0.0)
    mean = tl.sum(x, axis=1) / D
    diff = tl.where(inside, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(diff * diff, axis=1) / D + eps)
    y = diff * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(B + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    offsets = rows[:, None].to(tl.int64) * D + cols[None, :]
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=inside)
    tl.store(S + offsets, s, mask=inside)
    tl.store(MEAN + rows, mean, mask=rows < M)
    tl.store(RSTD + rows, rstd, mask=rows < M)


@triton.jit(do_not_specialize=["seed", "threshold"])  # a new seed every call: no recompiling
def norm_backward_kernel(DY, S, W, MEAN, RSTD, DH, DR, M, stride_dy, seed, groups_per_row, threshold, scale,
                         D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, HAS_W: tl.constexpr,
                         DROP: tl.constexpr, WANT_H: tl.constexpr, WANT_R: tl.constexpr):
    """The gradients of :func:`norm_forward_kernel`'s inputs from Y's: DR, the sum's (LayerNorm's
    backward with frozen weights), and DH, the same through the dropout's mask, drawn again."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BD)
    inside = (rows[:, None] < M) & (cols[None, :] < D)
    offsets = rows[:, None].to(tl.int64) * D + cols[None, :]
    dy = tl.load(DY + rows[:, None].to(tl.int64) * stride_dy + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    s = tl.load(S + offsets, mask=inside, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + rows, mask=rows < M, other=0.0)
    rstd = tl.load(RSTD + rows, mask=rows < M, other=0.0)
    xhat = tl.where(inside, (s - mean[:, None]) * rstd[:, None], 0.0)
    if HAS_W:
        dy = dy * tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    c1 = tl.sum(dy * xhat, axis=1) / D
    c2 = tl.sum(dy, axis=1) / D
    ds = tl.where(inside, (dy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None], 0.0)
    if WANT_R:
        tl.store(DR + offsets, ds.to(DR.dtype.element_ty), mask=inside)
    if WANT_H:
        if DROP:
            ds = ds * (keep_tile(seed, rows, 0, groups_per_row, threshold, BD // 8).to(tl.float32) * scale)
        tl.store(DH + offsets, ds.to(DH.dtype.element_ty), mask=inside)


@triton.jit
def ce_forward_kernel(X, T, LSE, LOSS, stride_x, ignore_index, V: tl.constexpr, BV: tl.constexpr):
    """Row ``row`` of X (V logits, any float dtype): LSE = log Σ exp(x) in fp32, from one read of
    the row (each lane keeps a running maximum and its sum of exponentials rescaled to it), and
    LOSS = LSE - x[target]: 0 where the target is ``ignore_index``, NaN where it is outside
    0..V-1 (nothing read there). A NaN logit makes its row's LSE and loss NaN, as eager's."""
    row = tl.program_id(0).to(tl.int64)
    base = X + row * stride_x
    top = tl.full((BV,), float("-inf"), tl.float32)
    total = tl.zeros((BV,), tl.float32)
    for v0 in range(0, V, BV):
        cols = v0 + tl.arange(0, BV)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        new = tl.maximum(top, x)
        shift = tl.where(new == float("-inf"), 0.0, new)  # a lane with nothing yet: no -inf - -inf
        total = total * tl.exp(top - shift) + tl.exp(x - shift)
        top = new
    peak = tl.max(top, axis=0)
    lse = peak + tl.log(tl.sum(total * tl.exp(top - peak), axis=0))
    target = tl.load(T + row)
    valid = (target >= 0) & (target < V)
    picked = tl.load(base + target, mask=valid, other=0.0).to(tl.float32)
    loss = tl.where(valid, lse - picked, float("nan"))
    tl.store(LOSS + row, tl.where(target == ignore_index, 0.0, loss))
    tl.store(LSE + row, lse)


@triton.jit
def ce_backward_kernel(X, T, LSE, G, DX, stride_x, stride_dx, stride_g, ignore_index, V: tl.constexpr,
                       BV: tl.constexpr):
    """DX[row] = G[row] · (softmax(X[row]) - onehot(target)), from the row's LSE and one read of
    X's row, written in DX's dtype; 0 where the target is ``ignore_index``, NaN where it is outside
    0..V-1 (as the row's loss)."""
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(T + row)
    lse = tl.load(LSE + row)
    g = tl.load(G + row * stride_g).to(tl.float32)
    ignored = target == ignore_index
    valid = (target >= 0) & (target < V)
    for v0 in range(0, V, BV):
        cols = v0 + tl.arange(0, BV)
        x = tl.load(X + row * stride_x + cols, mask=cols < V, other=0.0).to(tl.float32)
        d = tl.where(valid, (tl.exp(x - lse) - (cols == target).to(tl.float32)) * g, float("nan"))
        d = tl.where(ignored, 0.0, d)
        tl.store(DX + row * stride_dx + cols, d.to(DX.dtype.element_ty), mask=cols < V)
