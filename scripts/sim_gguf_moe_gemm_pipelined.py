#!/usr/bin/env python3
# Host-side simulations of gpu/gguf_moe_gemm_pipelined.cu (issue 27, k37b),
# written while the kernel could only be compiled, not run:
#  1. index maps, symbolically: the activation copies (slot_col), the
#     decoders' run order (Run::e) into the weight stage, ldmatrix.x4's
#     distribution (PTX: matrix i's row addresses from lanes 8i..8i+7; lane l
#     gets row l/4, columns 2(l%4), +1), the m16n8k16 A/B/C fragment layouts
#     and the epilogue. Every output (row, n) must sum X[row][c] W[n][c] over
#     every column c exactly once, with the same c on both sides.
#  2. the pipeline's buffer hazards with cp.async groups (wait_group 1 at the
#     end of each sub-step): no read of stale data, no read or write of a
#     buffer while a copy into it is in flight.
# Keep it in step with the kernel when its tiles or schedule change.
# Usage: scripts/sim_gguf_moe_gemm_pipelined.py  (about 20 s; prints ok lines)
import sys
BN, SK, LDX = 128, 64, 72
def run_e(typ, q, k):  # the decoders' r[k].e for unit q (relative to the 256-col span)
    if typ == 'Q6K': h, g = q >> 1, q & 1; return 128*h + 32*k + 16*g
    if typ == 'EB64': return 64*q + 16*k   # group q of the span at q*BB, unit 0: e = 16k (Q80: 32b+{0,16})
    return 64*q + 16*k
def slot_col(typ, q, k):
    if typ == 'Q6K': return 128*(q>>1) + 16*(q&1) + 32*k
    return 64*q + 16*k
def ldsm4(smem, addrs):  # addrs[lane] -> start index of an 8-element row; returns regs[lane][i] = (lo, hi)
    regs = [[None]*4 for _ in range(32)]
    for i in range(4):
        rows = [addrs[8*i + rr] for rr in range(8)]
        for l in range(32):
            base = rows[l // 4]
            regs[l][i] = (smem[base + 2*(l % 4)], smem[base + 2*(l % 4) + 1])
    return regs
def check(typ, BM, cols, mcnt):
    WM, MT = BM // 2, BM // 32
    S = cols // SK
    acc = {}  # (warp, lane, mt, nt, idx) -> [count, colsum, R, N]
    for j in range(S):
        Xs = [None] * (BM * LDX); Ws = [None] * (BN * LDX)
        # copy_x
        for tid in range(256):
            xc, xr = tid & 7, tid >> 3
            col = 256*(j >> 2) + slot_col(typ, j & 3, xc >> 1) + 8*(xc & 1)
            for i in range(BM // 32):
                r = xr + 32*i
                for u in range(8):
                    Xs[r*LDX + 8*xc + u] = ('x', r, col + u) if r < mcnt else ('z',)
        # dequant: thread t: row t>>1, runs 2dh, 2dh+1 at slots 2dh, 2dh+1 (o + 32 dh, +16)
        for tid in range(256):
            dr, dh = tid >> 1, tid & 1
            q = j & 3
            for kk, k in enumerate((2*dh, 2*dh + 1)):
                e = run_e(typ, q, k)
                for u in range(16):
                    Ws[dr*LDX + 32*dh + 16*kk + u] = ('w', dr, 256*(j >> 2) + e + u)
        assert None not in [Xs[r*LDX + c] for r in range(BM) for c in range(64)]
        assert None not in [Ws[r*LDX + c] for r in range(BN) for c in range(64)]
        for warp in range(8):
            wm, wn = warp >> 2, warp & 3
            a_off = [(wm*WM + (l & 15))*LDX + 8*(l >> 4) for l in range(32)]
            b_off = [(wn*32 + 8*(l >> 4) + (l & 7))*LDX + 8*((l >> 3) & 1) for l in range(32)]
            for kk in range(0, SK, 16):
                af = [ldsm4(Xs, [a_off[l] + mt*16*LDX + kk for l in range(32)]) for mt in range(MT)]
                bf = [ldsm4(Ws, [b_off[l] + np_*16*LDX + kk for l in range(32)]) for np_ in range(2)]
                for mt in range(MT):
                    for nt in range(4):
                        # assemble A (16x16) and B (16 k x 8 n) from the PTX fragment layout
                        A = [[None]*16 for _ in range(16)]; B = [[None]*8 for _ in range(16)]
                        for l in range(32):
                            g, t2 = l >> 2, (l & 3)*2
                            a = af[mt][l]
                            for idx, (rr, cc) in enumerate(((g, t2), (g+8, t2), (g, t2+8), (g+8, t2+8))):
                                A[rr][cc], A[rr][cc+1] = a[idx]
                            b0 = bf[nt >> 1][l][2*(nt & 1)]; b1 = bf[nt >> 1][l][2*(nt & 1) + 1]
                            B[t2][g], B[t2+1][g] = b0
                            B[t2+8][g], B[t2+9][g] = b1
                        for l in range(32):
                            g, t2 = l >> 2, (l & 3)*2
                            for idx, (rr, nn) in enumerate(((g, t2), (g, t2+1), (g+8, t2), (g+8, t2+1))):
                                key = (warp, l, mt, nt, idx)
                                ent = acc.setdefault(key, [0, 0, None, None])
                                for k in range(16):
                                    x, w = A[rr][k], B[k][nn]
                                    if x[0] == 'z': continue
                                    assert x[2] == w[2], (typ, j, x, w)  # same column on both sides
                                    ent[0] += 1; ent[1] += x[2]
                                    if ent[2] is None: ent[2], ent[3] = x[1], w[1]
                                    assert (ent[2], ent[3]) == (x[1], w[1])
    # epilogue map: r = wm*WM + mt*16 + g + 8*half; n = wn*32 + nt*8 + t2 + (idx&1)
    seen = set()
    full = cols*(cols-1)//2
    for (warp, l, mt, nt, idx), (cnt, cs, R, N) in acc.items():
        wm, wn, g, t2 = warp >> 2, warp & 3, l >> 2, (l & 3)*2
        half = idx >> 1
        r = wm*WM + mt*16 + g + 8*half; n = wn*32 + nt*8 + t2 + (idx & 1)
        if r >= mcnt: continue
        assert (R, N) == (r, n), ((R, N), (r, n))
        assert cnt == cols and cs == full, (cnt, cs)
        seen.add((r, n))
    assert len(seen) == mcnt * BN, len(seen)
    print('ok', typ, BM, cols, mcnt)

def check_pipeline(S):
    spans = S // 4
    content = {}
    pending = []  # list of groups: each a list of (buffer, data), oldest first
    def interval(async_ops, reads, sync_writes, wait_keep, commit=True):
        # async writes may land anytime until their group completes: no read of those buffers meanwhile
        inflight = {b for g in pending for b, d in g} | {b for b, d in async_ops}
        for b, d in reads:
            assert b not in inflight, ('read of a buffer with a copy in flight', b, d)
            assert content.get(b) == d, ('stale', b, content.get(b), d)
        for b, d in sync_writes:
            assert b not in inflight, ('sync write to a buffer with a copy in flight', b)
        if commit: pending.append(list(async_ops))
        while wait_keep is not None and len(pending) > wait_keep:
            for b, d in pending.pop(0): content[b] = d
        for b, d in sync_writes: content[b] = d
    # prologue: groups {raw0, X0}, {X1}; wait_group 1; barrier; dequant(0); barrier
    pending.append([(('raw', 0), ('raw', 0)), (('x', 0), ('x', 0))])
    interval([(('x', 1), ('x', 1))], [], [], 1)
    interval([], [(('raw', 0), ('raw', 0))], [(('ws', 0), ('ws', 0))], None, commit=False)
    for j in range(S):
        a = []
        if j + 2 < S: a.append((('x', (j+2) % 3), ('x', j+2)))
        if (j & 3) == 0 and (j >> 2) + 1 < spans: a.append((('raw', ((j >> 2)+1) & 1), ('raw', (j >> 2)+1)))
        reads = [(('x', j % 3), ('x', j)), (('ws', j & 1), ('ws', j))]
        sw = []
        if j + 1 < S:
            reads.append((('raw', ((j+1) >> 2) & 1), ('raw', (j+1) >> 2)))
            sw.append((('ws', (j+1) & 1), ('ws', j+1)))
        interval(a, reads, sw, 1)
    print('ok', S)

if __name__ == '__main__':
    for S in (4, 8, 12, 32):
        check_pipeline(S)
    for typ in ('Q6K', 'K', 'EB64'):
        for BM, mcnt in ((64, 64), (128, 100)):
            check(typ, BM, 512, mcnt)
