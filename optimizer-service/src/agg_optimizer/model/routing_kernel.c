/* The routing search's kernel in C: `shortest_paths._blocks` (its numba version and the
 * reference for what this computes), written so that the relaxation of one link for the 16
 * roots of a block is a few vector instructions. shortest_paths.py compiles this file on
 * the machine that runs it (cc -O3 -march=native, never -ffast-math: the distances must be
 * the same IEEE sums as scipy's Dijkstra and numba's kernel take) and calls it through
 * ctypes, which lets go of the GIL during the call, so both cores search at once.
 *
 * blocks(): next hops from roots[first:last] on the CSR graph (indptr, indices, data) of n
 * nodes, whose transpose is (rptr, ridx, rdata). pred is an (m x n) row-major int32 array:
 * row i gets, for each node on the paths of the nodes t_idx[t_ptr[i]:t_ptr[i + 1]] (an empty
 * range: every node), the node before it, and NO_HOP elsewhere. again[i] = 1 where scipy
 * must route root i: a tie on a path read (two links give a node its distance), or its
 * block not settled within `most` sweeps. Returns 0, or -1 where memory ran out. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16 /* shortest_paths.LANES */
#define NO_HOP (-9999)

/* W doubles per vector: 4 with AVX (256-bit registers), 2 with SSE2 or NEON. */
#ifdef __AVX__
#define W 4
#else
#define W 2
#endif
typedef double vd __attribute__((vector_size(8 * W)));
typedef int64_t vm __attribute__((vector_size(8 * W)));

int lanes_per_block(void) { return LANES; }

int blocks(int64_t n, const int64_t *indptr, const int64_t *indices, const double *data,
           const int64_t *rptr, const int64_t *ridx, const double *rdata,
           const int64_t *roots, const int64_t *t_ptr, const int64_t *t_idx, int64_t most,
           int64_t first, int64_t last, int32_t *pred, uint8_t *again)
{
    /* dist[v * LANES + b]: v's distance from the block's root b */
    double *dist = malloc(sizeof(double) * (size_t)n * LANES);
    uint8_t *dirty = calloc((size_t)n, 1); /* changed since it last pushed them on */
    if (!dist || !dirty) {
        free(dist);
        free(dirty);
        return -1;
    }
    for (int64_t s = first; s < last; s += LANES) {
        int64_t lanes = last - s < LANES ? last - s : LANES;
        for (int64_t i = 0; i < n * LANES; i++)
            dist[i] = INFINITY;
        for (int64_t b = 0; b < lanes; b++) {
            dist[roots[s + b] * LANES + b] = 0.0;
            dirty[roots[s + b]] = 1;
        }
        int64_t sweeps = 0;
        int busy = 1;
        while (busy && sweeps < most) {
            busy = 0;
            for (int64_t k = 0; k < n; k++) {
                int64_t u = sweeps % 2 == 0 ? k : n - 1 - k;
                if (!dirty[u])
                    continue;
                dirty[u] = 0;
                busy = 1;
                vd mine[LANES / W]; /* the pushing node's distances (a copy: u may link to u) */
                memcpy(mine, dist + u * LANES, sizeof mine);
                for (int64_t e = indptr[u]; e < indptr[u + 1]; e++) {
                    double *d = dist + indices[e] * LANES;
                    const vd w = (vd){0} + data[e];
                    vm less = {0};
                    for (int q = 0; q < LANES / W; q++) {
                        vd old, x = mine[q] + w;
                        memcpy(&old, d + W * q, sizeof old);
                        vm lt = x < old;
                        less |= lt;
                        old = (vd)(((vm)x & lt) | ((vm)old & ~lt)); /* the smaller, lane by lane */
                        memcpy(d + W * q, &old, sizeof old);
                    }
                    int64_t any = 0;
                    for (int j = 0; j < W; j++)
                        any |= less[j];
                    if (any)
                        dirty[indices[e]] = 1;
                }
            }
            sweeps++;
        }
        for (int64_t b = 0; b < lanes; b++) {
            int64_t i = s + b;
            int32_t *row = pred + i * n;
            for (int64_t v = 0; v < n; v++)
                row[v] = NO_HOP;
            if (busy) { /* not settled: scipy's */
                again[i] = 1;
                continue;
            }
            int64_t root = roots[i];
            int every = t_ptr[i] == t_ptr[i + 1];
            int64_t count = every ? n : t_ptr[i + 1] - t_ptr[i];
            for (int64_t k = 0; k < count; k++) {
                int64_t v = every ? k : t_idx[t_ptr[i] + k];
                while (v != root && row[v] == NO_HOP && !again[i]) {
                    double dv = dist[v * LANES + b];
                    if (dv == INFINITY) /* unreachable */
                        break;
                    int64_t hop = -1;
                    int ways = 0; /* links into v whose tail's distance plus weight is v's */
                    for (int64_t e = rptr[v]; e < rptr[v + 1]; e++) {
                        int64_t u = ridx[e];
                        if (dist[u * LANES + b] + rdata[e] == dv) {
                            ways++;
                            hop = u;
                        }
                    }
                    if (ways != 1) { /* a tie; or none, which settled distances rule out */
                        again[i] = 1;
                        break;
                    }
                    row[v] = (int32_t)hop;
                    v = hop;
                }
            }
        }
        memset(dirty, 0, (size_t)n);
    }
    free(dist);
    free(dirty);
    return 0;
}
