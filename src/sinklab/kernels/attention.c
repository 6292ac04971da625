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

/* One sequence through one layer: x, out (T, D); A, M this member's (H, D, D); s, w (H, T, T)
 * indexed (head, key, query); q, v (H, T, D), kept for the backward pass. */
static inline void forward_seq(int H, int rule, const f32 *restrict x, const f32 *restrict A,
                               const f32 *restrict M, f32 *restrict out, f32 *restrict s,
                               f32 *restrict w, f32 *restrict q, f32 *restrict v) {
    const int64_t DD = (int64_t)D * D;
    const v16 zero = {0}, scale = relu_scale();
    v16 X[16], OT[16], Q[16], V[16], ST[16], WT[16], Ar[16], Mr[16];
    for (int i = 0; i < 16; i++) {
        X[i] = i < T ? load_d(x + i * D) : zero;
        OT[i] = zero;
    }
    for (int h = 0; h < H; h++) {
        for (int p = 0; p < D; p++) {
            Ar[p] = load_d(A + h * DD + p * D);
            Mr[p] = load_d(M + h * DD + p * D);
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
                store_d(q + (h * T + i) * D, Q[i]);
                store_d(v + (h * T + i) * D, V[i]);
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
            store_t(s + (h * T + k) * T, ST[k]);
            store_t(w + (h * T + k) * T, WT[k]);
        }
    }
    transpose(OT);
    for (int i = 0; i < T; i++) store_d(out + i * D, OT[i]);
}

/* at[32 h .. 32 h + 15] the rows of A_h^T, then those of M_h^T, for this member's H heads. */
static void transposed(int H, const f32 *restrict A, const f32 *restrict M, v16 *restrict at) {
    const int64_t DD = (int64_t)D * D;
    const v16 zero = {0};
    for (int h = 0; h < H; h++) {
        v16 *a = at + 32 * h, *m = a + 16;
        for (int p = 0; p < 16; p++) {
            a[p] = p < D ? load_d(A + h * DD + p * D) : zero;
            m[p] = p < D ? load_d(M + h * DD + p * D) : zero;
        }
        transpose(a);
        transpose(m);
    }
}

/* One sequence's gradients through one layer, given g = d loss / d out (T, D): gx (T, D) is
 * overwritten, and this member's gA and gM (H, D, D) are added to. Layouts as forward_seq's;
 * at as ``transposed`` leaves it. */
static inline void backward_seq(int H, int rule, const f32 *restrict x, const v16 *restrict at,
                                const f32 *restrict s, const f32 *restrict w,
                                const f32 *restrict q, const f32 *restrict v,
                                const f32 *restrict g, f32 *restrict gx, f32 *restrict gA,
                                f32 *restrict gM) {
    const int64_t DD = (int64_t)D * D;
    const v16 zero = {0}, scale = relu_scale();
    v16 X[16], G[16], GT[16], GX[16], Q[16], WT[16], ST[16], GST[16], GQ[16], GV[16];
    v16 Vr[16];
    for (int i = 0; i < 16; i++) {
        X[i] = i < T ? load_d(x + i * D) : zero;
        G[i] = GT[i] = i < T ? load_d(g + i * D) : zero;
        GX[i] = zero;
    }
    transpose(GT); /* GT[c] holds g_ic over queries i */
    for (int h = 0; h < H; h++) {
        const v16 *ah = at + 32 * h, *mh = ah + 16;
        for (int i = 0; i < T; i++) {
            Q[i] = load_d(q + (h * T + i) * D);
            Vr[i] = load_d(v + (h * T + i) * D);
            WT[i] = load_t(w + (h * T + i) * T);
            if (rule == RELU) ST[i] = load_t(s + (h * T + i) * T);
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
            v16 ga = load_d(gA + h * DD + p * D), gm = load_d(gM + h * DD + p * D);
            for (int i = 0; i < T; i++) {
                ga += X[i][p] * GQ[i];
                gm += X[i][p] * GV[i];
            }
            store_d(gA + h * DD + p * D, ga);
            store_d(gM + h * DD + p * D, gm);
        }
        for (int i = 0; i < T; i++) { /* the queries' and values' share of gx */
            v16 gxi = GX[i];
            for (int c = 0; c < D; c++) gxi += GQ[i][c] * ah[c] + GV[i][c] * mh[c];
            GX[i] = gxi;
        }
    }
    for (int i = 0; i < T; i++) store_d(gx + i * D, GX[i]);
}

int sinklab_attention_forward(int64_t EB, int64_t B, int H, int rule,
                              const f32 *restrict x, const f32 *restrict A,
                              const f32 *restrict M, f32 *restrict out, f32 *restrict s,
                              f32 *restrict w, f32 *restrict q, f32 *restrict v) {
    const int64_t TD = (int64_t)T * D, DD = (int64_t)D * D, HTT = (int64_t)H * T * T;
    for (int64_t eb = 0; eb < EB; eb++) {
        const int64_t e = eb / B;
        forward_seq(H, rule, x + eb * TD, A + e * H * DD, M + e * H * DD, out + eb * TD,
                    s + eb * HTT, w + eb * HTT, q + eb * H * TD, v + eb * H * TD);
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
    const int64_t TD = (int64_t)T * D, DD = (int64_t)D * D, HTT = (int64_t)H * T * T;
    const int64_t E = EB / B;
    memset(gA, 0, sizeof(f32) * (size_t)(E * H * DD));
    memset(gM, 0, sizeof(f32) * (size_t)(E * H * DD));
    v16 *AT = aligned_alloc(sizeof(v16), sizeof(v16) * 32 * (size_t)(E * H));
    if (!AT) return 1;
    for (int64_t e = 0; e < E; e++)
        transposed(H, A + e * H * DD, M + e * H * DD, AT + 32 * e * H);
    for (int64_t eb = 0; eb < EB; eb++) {
        const int64_t e = eb / B;
        backward_seq(H, rule, x + eb * TD, AT + 32 * e * H, s + eb * HTT, w + eb * HTT,
                     q + eb * H * TD, v + eb * H * TD, g + eb * TD, gx + eb * TD,
                     gA + e * H * DD, gM + e * H * DD);
    }
    free(AT);
    return 0;
}

/* --------------------------------------------------------------- the whole training step */

/* The layers of one training step of members e0..e1-1 of an ensemble of E attention-only
 * stacks of L layers, H heads each (sinklab.model.AttentionStack with model.block="attention"
 * and BOS visible), with the MSE loss: forward through every layer and the residual adds
 * (plain stacks: residual = 0), the loss and L-infinity error of each member's batch, and the
 * gradient of the summed loss with respect to every layer's folded weights.
 *
 * A, M (L, E, H, D, D): the folds W_Q W_K^T and W_V W_O of every layer; gA, gM the same shape,
 * overwritten. x, y (E, B, T, D); loss, linf (E). keep: NULL, or (L, E * B, H, T, T) to receive
 * every layer's weights (head, key, query) as sinklab_attention_forward lays them out. A
 * member's sums run over its sequences in order, each sequence forward and then backward
 * through the stack while its activations are still in cache; each layer is forward_seq and
 * backward_seq, as in sinklab_attention_forward and _backward, so the gradients are bitwise
 * those of the per-layer functions under autograd, whatever the ensemble or the split of
 * members between threads. Returns 1 if the workspace cannot be allocated. */
int sinklab_train_step(int64_t E, int64_t e0, int64_t e1, int64_t B, int H, int L, int rule,
                       int residual, const f32 *restrict Af, const f32 *restrict Mf,
                       f32 *restrict gAf, f32 *restrict gMf, const f32 *restrict x,
                       const f32 *restrict y, f32 *restrict loss, f32 *restrict linf,
                       f32 *restrict keep) {
    const int64_t TD = (int64_t)T * D, DD = (int64_t)D * D, HTT = (int64_t)H * T * T;
    const int64_t HDD = H * DD, P = E * HDD; /* one member's heads; one layer's (E, H, D, D) */
    const f32 n = (f32)(B * TD);
    const size_t floats = (size_t)(2 * L * HDD + (L + 1) * TD + 2 * L * (HTT + H * TD) + 2 * TD);
    f32 *work = malloc(sizeof(f32) * floats);
    v16 *at = aligned_alloc(sizeof(v16), sizeof(v16) * 32 * (size_t)(L * H));
    if (!work || !at) {
        free(work);
        free(at);
        return 1;
    }
    f32 *A = work, *M = A + L * HDD; /* this member's layers, gathered */
    f32 *hs = M + L * HDD, *S = hs + (L + 1) * TD, *W = S + L * HTT;
    f32 *Q = W + L * HTT, *V = Q + L * H * TD, *g = V + L * H * TD, *gx = g + TD;
    for (int64_t e = e0; e < e1; e++) {
        f32 *gA = gAf + e * HDD, *gM = gMf + e * HDD; /* layer l at + l * P */
        for (int l = 0; l < L; l++) {
            memcpy(A + l * HDD, Af + l * P + e * HDD, sizeof(f32) * (size_t)HDD);
            memcpy(M + l * HDD, Mf + l * P + e * HDD, sizeof(f32) * (size_t)HDD);
            transposed(H, A + l * HDD, M + l * HDD, at + 32 * l * H);
            memset(gA + l * P, 0, sizeof(f32) * (size_t)HDD);
            memset(gM + l * P, 0, sizeof(f32) * (size_t)HDD);
        }
        v16 sq = {0};
        f32 worst = 0.0f;
        for (int64_t b = 0; b < B; b++) {
            const int64_t eb = e * B + b;
            memcpy(hs, x + eb * TD, sizeof(f32) * (size_t)TD);
            for (int l = 0; l < L; l++) {
                f32 *in = hs + l * TD, *out = in + TD;
                forward_seq(H, rule, in, A + l * HDD, M + l * HDD, out, S + l * HTT,
                            W + l * HTT, Q + l * H * TD, V + l * H * TD);
                if (residual)
                    for (int64_t i = 0; i < TD; i++) out[i] = in[i] + out[i];
                if (keep)
                    memcpy(keep + ((int64_t)l * E * B + eb) * HTT, W + l * HTT,
                           sizeof(f32) * (size_t)HTT);
            }
            const f32 *top = hs + L * TD, *target = y + eb * TD;
            for (int i = 0; i < T; i++) {
                const v16 err = load_d(top + i * D) - load_d(target + i * D);
                sq += err * err;
                for (int c = 0; c < D; c++) {
                    const f32 a = err[c] < 0 ? -err[c] : err[c];
                    if (!(a <= worst) && worst == worst) worst = a; /* NaN stays, as in torch.amax */
                }
                store_d(g + i * D, err * 2.0f * (1.0f / n));
            }
            for (int l = L - 1; l >= 0; l--) {
                backward_seq(H, rule, hs + l * TD, at + 32 * l * H, S + l * HTT, W + l * HTT,
                             Q + l * H * TD, V + l * H * TD, g, gx, gA + l * P, gM + l * P);
                if (residual)
                    for (int64_t i = 0; i < TD; i++) g[i] = g[i] + gx[i];
                else
                    memcpy(g, gx, sizeof(f32) * (size_t)TD);
            }
        }
        f32 total = 0.0f;
        for (int c = 0; c < 16; c++) total += sq[c];
        loss[e] = total / n;
        linf[e] = worst;
    }
    free(work);
    free(at);
    return 0;
}
