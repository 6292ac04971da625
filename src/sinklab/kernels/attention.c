/* One layer of the paper's attention-only heads, forward and backward, on a CPU in float32.
 *
 * The layer is folded as in sinklab.model.Attention: head h scores query i against key k as
 * s_ik = (x_i A_h) . x_k with A_h = W_Q^h W_K^h^T, and adds sum_k w_ik (x_k M_h) with
 * M_h = W_V^h W_O^h. One sequence is worked through at a time, head by head, as 16 x 16 tiles
 * held in vector registers: a row of a tile is one 16-float vector, and T and D may be smaller
 * (the tiles are padded with zeros and padded keys are masked). The rule runs across the key
 * tiles' rows, so every query's softmax proceeds side by side in the lanes of one vector, and
 * nothing round-trips through memory between the products, the rule and its gradient.
 *
 * T (seq_len) and D (d_model), each 1..16, are compile-time constants (-DT=.. -DD=..).
 * Layouts, row-major and contiguous: x, out, g, gx (EB, T, D); A, M, gA, gM (E, H, D, D),
 * member e = eb / B; s, w (EB, H, T, T) indexed (head, key, query), so that a key's scores
 * for every query are one vector; q, v (EB, H, T, D), kept for the backward pass.
 * Rules: 0 softmax, 1 ReLU / max(i, 1) (sinklab.attention.softmax and relu).
 * Built and loaded by sinklab.kernels; sinklab.model uses PyTorch's operators without it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(T) || !defined(D) || T > 16 || D > 16 || T < 1 || D < 1
#error "compile with -DT=<seq_len> -DD=<d_model>, each between 1 and 16"
#endif

typedef float f32;
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

enum { SOFTMAX = 0, RELU = 1 };

static const v16i LANE = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static inline v16 load_d(const f32 *p) { v16 r = {0}; memcpy(&r, p, sizeof(f32) * D); return r; }
static inline void store_d(f32 *p, v16 r) { memcpy(p, &r, sizeof(f32) * D); }
static inline v16 load_t(const f32 *p) { v16 r = {0}; memcpy(&r, p, sizeof(f32) * T); return r; }
static inline void store_t(f32 *p, v16 r) { memcpy(p, &r, sizeof(f32) * T); }

static inline v16 blend(v16i mask, v16 a, v16 b) { /* a where mask, else b */
    return (v16)(((v16i)a & mask) | ((v16i)b & ~mask));
}

/* In-place transpose of a 16 x 16 tile: four rounds that swap the off-diagonal b x b blocks of
 * every 2b x 2b block, b = 8, 4, 2, 1, each a two-source shuffle per row. */
static inline void transpose(v16 *t) {
#pragma GCC unroll 4
    for (int b = 8; b >= 1; b /= 2) {
        v16i first, second;
        for (int c = 0; c < 16; c++) {
            first[c] = (c & b) ? 16 + c - b : c;
            second[c] = (c & b) ? 16 + c : c + b;
        }
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            if (r & b) continue;
            const v16 a = t[r], c = t[r + b];
            t[r] = __builtin_shuffle(a, c, first);
            t[r + b] = __builtin_shuffle(a, c, second);
        }
    }
}

/* e^x lane by lane for x <= 0, within 1e-7 relative, 0 below -87 (under FLT_MIN) and for -inf:
 * round x / ln 2 to n, take r = x - n ln 2 in two parts, a degree-6 polynomial for e^r, and
 * 2^n from the exponent bits. */
static inline v16 exp_nonpositive(v16 x) {
    const v16 zero = {0};
    const v16 magic = zero + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const v16i under = x < -87.0f;
    v16 n = (x * 1.44269504088896341f + magic) - magic;
    n = blend(under, zero - 127.0f, n); /* keeps -inf and tiny x out of the exponent bits */
    v16 r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    v16 p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const v16i k = __builtin_convertvector(n, v16i) + 127;
    return blend(under, zero, p * (v16)(k << 23));
}

/* Key k's tile row holds s_ik for every query i in its lanes; query i sees keys 0..i. */
static inline v16i sees(int k) { return LANE >= k; }

/* 1 / max(i, 1) in lane i: ReLU's divisor, the number of non-BOS keys query i sees */
static inline v16 relu_scale(void) {
    v16 scale;
    for (int i = 0; i < 16; i++) scale[i] = 1.0f / (f32)(i > 1 ? i : 1);
    return scale;
}

int sinklab_attention_forward(int64_t EB, int64_t B, int H, int rule,
                              const f32 *restrict x, const f32 *restrict A,
                              const f32 *restrict M, f32 *restrict out, f32 *restrict s,
                              f32 *restrict w, f32 *restrict q, f32 *restrict v) {
    const int64_t TD = (int64_t)T * D, DD = (int64_t)D * D;
    const v16 zero = {0}, scale = relu_scale();
    v16 X[16], OT[16], Q[16], V[16], ST[16], WT[16], Ar[16], Mr[16];
    for (int64_t eb = 0; eb < EB; eb++) {
        const int64_t e = eb / B;
        for (int i = 0; i < 16; i++) {
            X[i] = i < T ? load_d(x + eb * TD + i * D) : zero;
            OT[i] = zero;
        }
        for (int h = 0; h < H; h++) {
            for (int p = 0; p < D; p++) {
                Ar[p] = load_d(A + (e * H + h) * DD + p * D);
                Mr[p] = load_d(M + (e * H + h) * DD + p * D);
            }
            for (int i = 0; i < 16; i++) { /* Q = X A, V = X M */
                v16 qi[2] = {zero, zero}, vi[2] = {zero, zero}; /* two chains each */
                for (int p = 0; p < D && i < T; p++) {
                    qi[p & 1] += X[i][p] * Ar[p];
                    vi[p & 1] += X[i][p] * Mr[p];
                }
                Q[i] = qi[0] + qi[1];
                V[i] = vi[0] + vi[1];
                if (i < T) {
                    store_d(q + ((eb * H + h) * T + i) * D, Q[i]);
                    store_d(v + ((eb * H + h) * T + i) * D, V[i]);
                }
            }
            transpose(Q); /* now Q[c] holds q_ic over queries i */
            for (int k = 0; k < T; k++) {
                v16 sk[2] = {zero, zero};
                for (int c = 0; c < D; c++) sk[c & 1] += X[k][c] * Q[c];
                ST[k] = sk[0] + sk[1];
            }
            if (rule == SOFTMAX) {
                v16 m = ST[0];
                for (int k = 1; k < T; k++) m = blend(sees(k) & (ST[k] > m), ST[k], m);
                v16 sum[2] = {zero, zero}; /* two chains of additions instead of one */
                for (int k = 0; k < T; k++) {
                    WT[k] = blend(sees(k), exp_nonpositive(ST[k] - m), zero);
                    sum[k & 1] += WT[k];
                }
                const v16 inv = 1.0f / (sum[0] + sum[1]);
                for (int k = 0; k < T; k++) WT[k] *= inv;
            } else {
                for (int k = 0; k < T; k++)
                    WT[k] = blend(sees(k) & (ST[k] > 0.0f), ST[k] * scale, zero);
            }
            for (int c = 0; c < D; c++) { /* out^T += V^T W^T, over keys */
                v16 oc[2] = {OT[c], zero};
                for (int k = 0; k < T; k++) oc[k & 1] += V[k][c] * WT[k];
                OT[c] = oc[0] + oc[1];
            }
            for (int k = 0; k < T; k++) {
                store_t(s + ((eb * H + h) * T + k) * T, ST[k]);
                store_t(w + ((eb * H + h) * T + k) * T, WT[k]);
            }
        }
        transpose(OT);
        for (int i = 0; i < T; i++) store_d(out + eb * TD + i * D, OT[i]);
    }
    return 0;
}

/* Gradients with respect to x, A and M given g = d loss / d out. gA and gM are overwritten;
 * each member's sum over its sequences runs in a fixed order, whatever the ensemble. */
int sinklab_attention_backward(int64_t EB, int64_t B, int H, int rule,
                               const f32 *restrict x, const f32 *restrict A,
                               const f32 *restrict M, const f32 *restrict s,
                               const f32 *restrict w, const f32 *restrict q,
                               const f32 *restrict v, const f32 *restrict g,
                               f32 *restrict gx, f32 *restrict gA, f32 *restrict gM) {
    const int64_t TD = (int64_t)T * D, DD = (int64_t)D * D;
    const int64_t E = EB / B;
    const v16 zero = {0}, scale = relu_scale();
    v16 X[16], G[16], GT[16], GX[16], Q[16], WT[16], ST[16], GST[16], GQ[16], GV[16];
    v16 Vr[16];
    memset(gA, 0, sizeof(f32) * (size_t)(E * H * DD));
    memset(gM, 0, sizeof(f32) * (size_t)(E * H * DD));
    v16 *AT = aligned_alloc(sizeof(v16), sizeof(v16) * 32 * (size_t)(E * H)); /* rows of A_h^T, then of M_h^T */
    if (!AT) return 1;
    for (int64_t eh = 0; eh < E * H; eh++) {
        v16 *at = AT + 32 * eh, *mt = at + 16;
        for (int p = 0; p < 16; p++) {
            at[p] = p < D ? load_d(A + eh * DD + p * D) : zero;
            mt[p] = p < D ? load_d(M + eh * DD + p * D) : zero;
        }
        transpose(at);
        transpose(mt);
    }
    for (int64_t eb = 0; eb < EB; eb++) {
        const int64_t e = eb / B;
        for (int i = 0; i < 16; i++) {
            X[i] = i < T ? load_d(x + eb * TD + i * D) : zero;
            G[i] = GT[i] = i < T ? load_d(g + eb * TD + i * D) : zero;
            GX[i] = zero;
        }
        transpose(GT); /* GT[c] holds g_ic over queries i */
        for (int h = 0; h < H; h++) {
            const int64_t eh = e * H + h;
            const v16 *at = AT + 32 * eh, *mt = at + 16;
            for (int i = 0; i < T; i++) {
                Q[i] = load_d(q + ((eb * H + h) * T + i) * D);
                Vr[i] = load_d(v + ((eb * H + h) * T + i) * D);
                WT[i] = load_t(w + ((eb * H + h) * T + i) * T);
                if (rule == RELU) ST[i] = load_t(s + ((eb * H + h) * T + i) * T);
            }
            for (int k = 0; k < T; k++) { /* d loss / d w_ik = g_i . v_k, over queries i */
                v16 gwk = zero;
                for (int c = 0; c < D; c++) gwk += Vr[k][c] * GT[c];
                GST[k] = rule == SOFTMAX ? gwk
                                         : blend(sees(k) & (ST[k] > 0.0f), gwk * scale, zero);
            }
            if (rule == SOFTMAX) { /* d loss / d s_ik = w_ik (gw_ik - sum_k' w_ik' gw_ik') */
                v16 dot[2] = {zero, zero};
                for (int k = 0; k < T; k++) dot[k & 1] += WT[k] * GST[k];
                const v16 total = dot[0] + dot[1];
                for (int k = 0; k < T; k++) GST[k] = WT[k] * (GST[k] - total);
            }
            for (int k = 0; k < T; k++) { /* gv_k = sum_i w_ik g_i; the keys' share of gx */
                v16 gvk = zero, gxk = GX[k];
                for (int i = k; i < T; i++) {
                    gvk += WT[k][i] * G[i];
                    gxk += GST[k][i] * Q[i];
                }
                GV[k] = gvk;
                GX[k] = gxk;
            }
            for (int i = 0; i < T; i++) { /* gq_i = sum_k gs_ik x_k */
                v16 gqi = zero;
                for (int k = 0; k <= i; k++) gqi += GST[k][i] * X[k];
                GQ[i] = gqi;
            }
            for (int p = 0; p < D; p++) {
                v16 ga = load_d(gA + eh * DD + p * D), gm = load_d(gM + eh * DD + p * D);
                for (int i = 0; i < T; i++) {
                    ga += X[i][p] * GQ[i];
                    gm += X[i][p] * GV[i];
                }
                store_d(gA + eh * DD + p * D, ga);
                store_d(gM + eh * DD + p * D, gm);
            }
            for (int i = 0; i < T; i++) { /* the queries' and values' share of gx */
                v16 gxi = GX[i];
                for (int c = 0; c < D; c++) gxi += GQ[i][c] * at[c] + GV[i][c] * mt[c];
                GX[i] = gxi;
            }
        }
        for (int i = 0; i < T; i++) store_d(gx + eb * TD + i * D, GX[i]);
    }
    free(AT);
    return 0;
}
