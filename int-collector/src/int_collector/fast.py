"""The compiled receive path: batches of datagrams decoded and folded into state by numba.

`state.Fabric` and `wire.Decoder` are the reference; this module does the same work on
the common shape of report at machine speed, and defers everything else to them:

* `recv_batch` reads up to `BATCH` datagrams with one `recvmmsg` system call.
* `process_batch` decodes each datagram whose individual reports are all the common
  Telemetry Report v2.0 shape (INT report, IPv4 inner packet without options, UDP,
  INT-MD v2 marked by DSCP or UDP port, no RepMd, no DS Instruction, whole hops; the
  shape `Decoder._fast_v2` reads), and folds it into the state arrays as
  `Fabric.observe_datagram` would. Any other datagram (ONOS v1, RepMd, IPv6, TCP, TLVs,
  anything odd or broken) is handed back: the Python decoder decides it, with its exact
  drop reasons, and `FastFabric.observe_datagram` folds what it decoded into the same
  arrays through the same compiled fold.
* `FastFabric.due_points` runs change detection over the arrays and returns the same
  points as `Fabric.due_points`.

All state lives in preallocated numpy arrays (open-addressing hash tables, linked lists
for the LRU and the pending FIFO), bounded as `Fabric` bounds it. The fold replicates the
reference's arithmetic operation by operation (float64, same order), so both give the same
values; `tests/collector/test_fast.py` checks decode and points against the reference on
generated reports and on the fuzz corpus.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import socket
import time
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from .settings import Settings
from .state import Point, Rejected, _names_itself, flow_text, unwritten_limit
from .wire import Flow, Report

BATCH = 256  # datagrams per recvmmsg
SLOT = 65536  # bytes per datagram buffer: any UDP payload fits
MAXPATH = 256  # nodes on a flow's path (an INT-MD stack holds at most 252 hops)

# Link rows --------------------------------------------------------------------------------
# float64 columns (NaN: None)
LAT, LATMAX, Q, QMAX, UTIL, AGG, W_LAT, W_Q, W_UTIL, W_AGG, L_WRITTEN_AT = range(11)
NLF = 11
# int64 columns
(NODE, PORT, QUEUE, SAMPLES, DIRTY, LAST_SEEN, LSTATE, EVIDENCE, EVIDENCE_AT, UBYTES, UHAS,
 L_HAS_WRITTEN, L_PREV, L_NEXT) = range(14)  # fmt: skip
NLI = 14
# uint64 columns: utilisation-from-bytes window start and last timestamp
USTART, ULAST = 0, 1
FREE, PENDING, BORN = 0, 1, 2

# Flow rows --------------------------------------------------------------------------------
(F_SRC_HI, F_SRC_LO, F_DST_HI, F_DST_LO, F_PORTS, F_SINK, F_DIRTY, F_NEWS, F_LAST_SEEN,
 F_PLEN, F_PHASH, F_HAS_WRITTEN, F_W_PHASH, F_W_PLEN, F_PREV, F_NEXT,
 F_USED) = range(17)  # fmt: skip
NFI = 17
F_LAT, F_W_LAT, F_WRITTEN_AT = 0, 1, 2
NFF = 3

# Sequence tracker rows ---------------------------------------------------------------------
(T_NODE, T_HW, T_LAST, T_HAS_LAST, T_RECEIVED, T_LOST, T_LATE, T_REPEATED, T_RESTARTS,
 T_BITS, T_HAS_WRITTEN, T_W_LOST, T_W_RECEIVED, T_FRESH, T_LAST_TS, T_HAS_LAST_TS,
 T_PENDING, T_PREV, T_NEXT, T_USED) = range(20)  # fmt: skip
NTI = 20
WINDOW = 1024  # SequenceTracker's default

# Counters (int64) ----------------------------------------------------------------------------
(C_LINKS, C_PENDING, C_PHEAD, C_PTAIL, C_LFREE, C_LINKS_FULL, C_UNATTR, C_IMPLAUS, C_LOST,
 C_SERIAL, C_FRESH, C_FLOWS, C_FHEAD, C_FTAIL, C_FFREE, C_SEQ, C_SEQPEND, C_SHEAD, C_STAIL,
 C_SFREE, C_SWITCHES, C_DECODED, C_BYTES, C_DATAGRAMS, C_REJECTED, C_FEVICT,
 C_FEVICT_UNW) = range(27)  # fmt: skip
NC = 27

# Parameters --------------------------------------------------------------------------------
(P_ALPHA, P_V2_UNIT, P_V1_UNIT, P_TX_FULL, P_SPEED, P_UWINDOW, P_LAT_THR, P_Q_THR, P_U_THR,
 P_REL, P_KEEPALIVE, P_UNWRITTEN) = range(12)  # fmt: skip
(PI_MAX_LINKS, PI_MAX_FLOWS, PI_MAX_PENDING, PI_MIN_REPORTS, PI_FILTERING, PI_AGG_PORT,
 PI_V1_MIRROR, PI_DSCP, PI_DSCP_MASK, PI_ALLOWED, PI_FLOW_POINTS) = range(11)  # fmt: skip

# Extracted hop columns (uint64), and which of them a layout has
H_NODE, H_INPORT, H_EGPORT, H_LAT, H_QUEUE, H_ETS, H_TX = range(7)

U32 = np.uint64(0xFFFFFFFF)
U16 = np.uint64(0xFFFF)
U64MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
NONE = -1


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


# The state tuple S (FastFabric.S): these positions.
S_NAMES = ("lf", "li", "lu", "lht", "lfree", "fi", "ff", "fp", "fht", "ffree", "ti", "tf", "tht",
           "tfree", "sw", "allowed", "c", "p", "pi")  # fmt: skip

# Reports one datagram may carry on the compiled path (a report is at least 60 bytes, so
# a 64 KiB datagram holds fewer): a 65th used to send the whole datagram to the Python
# decoder, at a fraction of the rate (37% lost at 65 reports a datagram, issue 29).
MAX_REPORTS = 1100

# Hash tables: int64 slots holding row + 1 (0: empty), linear probing, backward-shift delete.


@njit(cache=True)
def _mix(x: np.int64) -> np.int64:
    h = np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(0x7FFFFFFFFFFFFFFF))


@njit(cache=True)
def _link_key(node, port, queue):
    return (node << 26) | (port << 9) | (queue + 1)


@njit(cache=True)
def _row_link_key(li, r):
    return _link_key(li[r, NODE], li[r, PORT], li[r, QUEUE])


@njit(cache=True)
def _link_find(ht, li, node, port, queue):
    mask = ht.shape[0] - 1
    k = _link_key(node, port, queue)
    i = _mix(k) & mask
    while True:
        v = ht[i]
        if v == 0:
            return -1, i
        r = v - 1
        if li[r, NODE] == node and li[r, PORT] == port and li[r, QUEUE] == queue:
            return r, i
        i = (i + 1) & mask


@njit(cache=True)
def _link_delete(ht, li, slot):
    mask = ht.shape[0] - 1
    i = slot
    j = i
    while True:
        j = (j + 1) & mask
        v = ht[j]
        if v == 0:
            break
        home = _mix(_row_link_key(li, v - 1)) & mask
        # Move j back to i if its home is not cyclically in (i, j].
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            ht[i] = v
            i = j
    ht[i] = 0


@njit(cache=True)
def _link_slot_of(ht, li, r):
    mask = ht.shape[0] - 1
    i = _mix(_row_link_key(li, r)) & mask
    while ht[i] != r + 1:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _flow_hash(fi, r):
    h = _mix(fi[r, F_SRC_HI]) ^ _mix(fi[r, F_SRC_LO] + 1)
    h = _mix(h ^ fi[r, F_DST_HI]) ^ _mix(fi[r, F_DST_LO] + 2)
    return _mix(h ^ fi[r, F_PORTS])


@njit(cache=True)
def _flow_hash_of(sh, sl, dh, dl, ports):
    h = _mix(sh) ^ _mix(sl + 1)
    h = _mix(h ^ dh) ^ _mix(dl + 2)
    return _mix(h ^ ports)


@njit(cache=True)
def _flow_find(ht, fi, sh, sl, dh, dl, ports):
    mask = ht.shape[0] - 1
    i = _flow_hash_of(sh, sl, dh, dl, ports) & mask
    while True:
        v = ht[i]
        if v == 0:
            return -1, i
        r = v - 1
        if (
            fi[r, F_SRC_LO] == sl and fi[r, F_DST_LO] == dl and fi[r, F_PORTS] == ports
            and fi[r, F_SRC_HI] == sh and fi[r, F_DST_HI] == dh
        ):  # fmt: skip
            return r, i
        i = (i + 1) & mask


@njit(cache=True)
def _flow_delete(ht, fi, r):
    mask = ht.shape[0] - 1
    i = _flow_hash(fi, r) & mask
    while ht[i] != r + 1:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        v = ht[j]
        if v == 0:
            break
        home = _flow_hash(fi, v - 1) & mask
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            ht[i] = v
            i = j
    ht[i] = 0


@njit(cache=True)
def _seq_key(node, hw):
    return (node << 8) | hw


@njit(cache=True)
def _seq_find(ht, ti, node, hw):
    mask = ht.shape[0] - 1
    i = _mix(_seq_key(node, hw)) & mask
    while True:
        v = ht[i]
        if v == 0:
            return -1, i
        r = v - 1
        if ti[r, T_NODE] == node and ti[r, T_HW] == hw:
            return r, i
        i = (i + 1) & mask


@njit(cache=True)
def _seq_delete(ht, ti, r):
    mask = ht.shape[0] - 1
    i = _mix(_seq_key(ti[r, T_NODE], ti[r, T_HW])) & mask
    while ht[i] != r + 1:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        v = ht[j]
        if v == 0:
            break
        rr = v - 1
        home = _mix(_seq_key(ti[rr, T_NODE], ti[rr, T_HW])) & mask
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            ht[i] = v
            i = j
    ht[i] = 0


@njit(cache=True)
def _set_has(ht, x):
    mask = ht.shape[0] - 1
    i = _mix(x) & mask
    while True:
        v = ht[i]
        if v == 0:
            return False
        if v == x + 1:
            return True
        i = (i + 1) & mask


@njit(cache=True)
def _set_add(ht, x):
    mask = ht.shape[0] - 1
    i = _mix(x) & mask
    while True:
        v = ht[i]
        if v == 0:
            ht[i] = x + 1
            return True
        if v == x + 1:
            return False
        i = (i + 1) & mask


# Doubly linked lists over rows (prev/next columns; -1 ends), head/tail in the counters.


@njit(cache=True)
def _list_append(a, r, cp, cn, c, ch, ct):
    a[r, cp] = c[ct]
    a[r, cn] = -1
    if c[ct] >= 0:
        a[c[ct], cn] = r
    else:
        c[ch] = r
    c[ct] = r


@njit(cache=True)
def _list_remove(a, r, cp, cn, c, ch, ct):
    p, n = a[r, cp], a[r, cn]
    if p >= 0:
        a[p, cn] = n
    else:
        c[ch] = n
    if n >= 0:
        a[n, cp] = p
    else:
        c[ct] = p


# Sequence numbers and plausibility (state.SequenceTracker, Fabric.observe_datagram) --------


@njit(cache=True)
def _observe_header(S, node, hw, seq, ts, has_ts, v2, names_itself):
    """Returns False if the datagram is rejected (allowed_switches)."""
    ti = S[10]
    tf = S[11]
    tht = S[12]
    tfree = S[13]
    sw = S[14]
    allowed = S[15]
    c = S[16]
    pi = S[18]
    if pi[PI_ALLOWED] and not _set_has(allowed, node):
        c[C_REJECTED] += 1
        return False
    c[C_SERIAL] += 1
    c[C_FRESH] = 0
    r, slot = _seq_find(tht, ti, node, hw)
    if r < 0:
        if c[C_SEQ] >= pi[PI_MAX_LINKS]:
            c[C_LINKS_FULL] += 1
        else:
            r = tfree[c[C_SFREE] - 1]
            c[C_SFREE] -= 1
            for k in range(NTI):
                ti[r, k] = 0
            tf[r, 0] = 0.0
            ti[r, T_NODE], ti[r, T_HW] = node, hw
            ti[r, T_BITS] = 22 if v2 else 32
            ti[r, T_USED] = 1
            ti[r, T_PENDING] = 1
            tht[slot] = r + 1
            c[C_SEQ] += 1
            _list_append(ti, r, T_PREV, T_NEXT, c, C_SHEAD, C_STAIL)
            c[C_SEQPEND] += 1
            if c[C_SEQPEND] > pi[PI_MAX_PENDING]:
                old = c[C_SHEAD]
                _list_remove(ti, old, T_PREV, T_NEXT, c, C_SHEAD, C_STAIL)
                c[C_SEQPEND] -= 1
                _seq_delete(tht, ti, old)
                ti[old, T_USED] = 0
                c[C_SEQ] -= 1
                tfree[c[C_SFREE]] = old
                c[C_SFREE] += 1
    if r < 0:
        return True
    modulus = np.int64(1) << ti[r, T_BITS]
    # advance(): the datagram moves its sender forward
    fresh = False
    if names_itself:
        fresh = True
        if has_ts:
            if ti[r, T_HAS_LAST_TS]:
                d = (ts - ti[r, T_LAST_TS]) % (np.int64(1) << 32)
                if not (0 < d < (np.int64(1) << 31)):
                    fresh = False
            if fresh:
                ti[r, T_LAST_TS] = ts
                ti[r, T_HAS_LAST_TS] = 1
        elif ti[r, T_HAS_LAST]:
            d = (seq - ti[r, T_LAST]) % modulus
            if not (0 < d <= WINDOW):
                fresh = False
        if fresh:
            ti[r, T_FRESH] += 1
    # observe()
    ti[r, T_RECEIVED] += 1
    if not ti[r, T_HAS_LAST]:
        ti[r, T_LAST] = seq
        ti[r, T_HAS_LAST] = 1
    else:
        ahead = (seq - ti[r, T_LAST]) % modulus
        if ahead == 0:
            ti[r, T_REPEATED] += 1
        elif ahead < modulus // 2:
            ti[r, T_LAST] = seq
            ti[r, T_LOST] += ahead - 1
            c[C_LOST] += ahead - 1
        else:
            behind = modulus - ahead
            if behind <= WINDOW:
                ti[r, T_LATE] += 1
                if ti[r, T_LOST]:
                    ti[r, T_LOST] -= 1
                    c[C_LOST] -= 1
            else:
                ti[r, T_RESTARTS] += 1
                ti[r, T_LAST] = seq
    pending = ti[r, T_PENDING] == 1
    if pending and (ti[r, T_FRESH] >= pi[PI_MIN_REPORTS] or not pi[PI_FILTERING]):
        _list_remove(ti, r, T_PREV, T_NEXT, c, C_SHEAD, C_STAIL)
        c[C_SEQPEND] -= 1
        ti[r, T_PENDING] = 0
        if _set_add(sw, node):
            c[C_SWITCHES] += 1
        pending = False
    c[C_FRESH] = 1 if (fresh and not pending) else 0
    return True


# Links -----------------------------------------------------------------------------------


@njit(cache=True)
def _free_link_row(S, r):
    li = S[1]
    lfree = S[4]
    c = S[16]
    li[r, LSTATE] = FREE
    lfree[c[C_LFREE]] = r
    c[C_LFREE] += 1


@njit(cache=True)
def _get_link(S, node, port, queue):
    """The born link, or its pending state, or -1 if the hop is not tracked (_pending)."""
    lf = S[0]
    li = S[1]
    lht = S[3]
    lfree = S[4]
    allowed = S[15]
    c = S[16]
    pi = S[18]
    r, slot = _link_find(lht, li, node, port, queue)
    if r >= 0 and li[r, LSTATE] == BORN:
        return r
    if pi[PI_ALLOWED] and not _set_has(allowed, node):
        c[C_IMPLAUS] += 1
        return -1
    if r < 0:
        r = lfree[c[C_LFREE] - 1]
        c[C_LFREE] -= 1
        for k in range(NLF):
            lf[r, k] = np.nan
        lf[r, LATMAX] = 0.0
        lf[r, QMAX] = 0.0
        lf[r, L_WRITTEN_AT] = 0.0
        for k in range(NLI):
            li[r, k] = 0
        li[r, NODE], li[r, PORT], li[r, QUEUE] = node, port, queue
        li[r, LSTATE] = PENDING
        lht[slot] = r + 1
        _list_append(li, r, L_PREV, L_NEXT, c, C_PHEAD, C_PTAIL)
        c[C_PENDING] += 1
        if c[C_PENDING] > pi[PI_MAX_PENDING]:
            old = c[C_PHEAD]
            _list_remove(li, old, L_PREV, L_NEXT, c, C_PHEAD, C_PTAIL)
            c[C_PENDING] -= 1
            c[C_IMPLAUS] += li[old, SAMPLES]
            _link_delete(lht, li, _link_slot_of(lht, li, old))
            _free_link_row(S, old)
    if c[C_FRESH] and li[r, EVIDENCE_AT] != c[C_SERIAL]:
        li[r, EVIDENCE] += 1
        li[r, EVIDENCE_AT] = c[C_SERIAL]
    if li[r, EVIDENCE] < pi[PI_MIN_REPORTS] and pi[PI_FILTERING]:
        return r
    _list_remove(li, r, L_PREV, L_NEXT, c, C_PHEAD, C_PTAIL)
    c[C_PENDING] -= 1
    if c[C_LINKS] >= pi[PI_MAX_LINKS]:
        c[C_LINKS_FULL] += li[r, SAMPLES] + 1
        _link_delete(lht, li, _link_slot_of(lht, li, r))
        _free_link_row(S, r)
        return -1
    li[r, LSTATE] = BORN
    c[C_LINKS] += 1
    return r


@njit(cache=True)
def _ewma(old, x, a):
    if math.isnan(old):
        return x
    return old + a * (x - old)


@njit(cache=True)
def _update_link(S, r, lat, occ, util, agg, now):
    lf = S[0]
    li = S[1]
    p = S[17]
    a = p[P_ALPHA]
    if not math.isnan(lat):
        lf[r, LAT] = _ewma(lf[r, LAT], lat, a)
        if lat > lf[r, LATMAX]:
            lf[r, LATMAX] = lat
    if occ >= 0:
        o = float(occ)
        lf[r, Q] = _ewma(lf[r, Q], o, a)
        if o > lf[r, QMAX]:
            lf[r, QMAX] = o
    if not math.isnan(util):
        lf[r, UTIL] = _ewma(lf[r, UTIL], util, a)
    if not math.isnan(agg):
        lf[r, AGG] = _ewma(lf[r, AGG], agg, a)
    li[r, SAMPLES] += 1
    li[r, DIRTY] = 1
    li[r, LAST_SEEN] = now


@njit(cache=True)
def _util_from_bytes(S, r, ts, v2, unit, length):
    li = S[1]
    lu = S[2]
    p = S[17]
    if not li[r, UHAS]:
        lu[r, USTART] = ts
        lu[r, ULAST] = ts
        li[r, UBYTES] = length
        li[r, UHAS] = 1
        return np.nan
    if v2:
        step = ts - lu[r, ULAST]  # uint64: modulo 2**64
        back = step > (np.uint64(1) << np.uint64(63))
    else:
        step = (ts - lu[r, ULAST]) & U32
        back = step > np.uint64(1 << 31)
    if back:
        lu[r, USTART] = ts
        lu[r, ULAST] = ts
        li[r, UBYTES] = length
        return np.nan
    lu[r, ULAST] = ts
    span_ticks = (ts - lu[r, USTART]) if v2 else ((ts - lu[r, USTART]) & U32)
    span_ns = float(span_ticks) * unit
    if span_ns < p[P_UWINDOW]:
        li[r, UBYTES] += length
        return np.nan
    util = float(li[r, UBYTES] * 8) / (span_ns * 1e-9 * p[P_SPEED])
    lu[r, USTART] = ts
    li[r, UBYTES] = length
    if util >= 0:
        return min(util, 1.0)
    return np.nan


# Flows -------------------------------------------------------------------------------------


@njit(cache=True)
def _flow(S, sh, sl, dh, dl, ports, sink, path, npath, latency, now):
    fi = S[5]
    ff = S[6]
    fp = S[7]
    fht = S[8]
    ffree = S[9]
    c = S[16]
    p = S[17]
    pi = S[18]
    r, slot = _flow_find(fht, fi, sh, sl, dh, dl, ports)
    if r < 0:
        r = ffree[c[C_FFREE] - 1]
        c[C_FFREE] -= 1
        for k in range(NFI):
            fi[r, k] = 0
        ff[r, F_LAT] = np.nan
        ff[r, F_W_LAT] = np.nan
        ff[r, F_WRITTEN_AT] = 0.0
        fi[r, F_SRC_HI], fi[r, F_SRC_LO], fi[r, F_DST_HI], fi[r, F_DST_LO] = sh, sl, dh, dl
        fi[r, F_PORTS] = ports
        fi[r, F_USED] = 1
        fht[slot] = r + 1
        _list_append(fi, r, F_PREV, F_NEXT, c, C_FHEAD, C_FTAIL)
        c[C_FLOWS] += 1
        if c[C_FLOWS] > pi[PI_MAX_FLOWS]:
            old = c[C_FHEAD]
            _list_remove(fi, old, F_PREV, F_NEXT, c, C_FHEAD, C_FTAIL)
            _flow_delete(fht, fi, old)
            fi[old, F_USED] = 0
            c[C_FLOWS] -= 1
            c[C_FEVICT] += 1
            c[C_FEVICT_UNW] += fi[old, F_NEWS]
            ffree[c[C_FFREE]] = old
            c[C_FFREE] += 1
    else:
        _list_remove(fi, r, F_PREV, F_NEXT, c, C_FHEAD, C_FTAIL)
        _list_append(fi, r, F_PREV, F_NEXT, c, C_FHEAD, C_FTAIL)
    h = np.int64(npath)
    for k in range(npath):  # path is newest first; a flow's path reads source to sink
        v = path[npath - 1 - k]
        fp[r, k] = v
        h = _mix(h ^ np.int64(v))
    fi[r, F_PLEN] = npath
    fi[r, F_PHASH] = h
    fi[r, F_SINK] = sink
    if not math.isnan(latency):
        ff[r, F_LAT] = _ewma(ff[r, F_LAT], latency, p[P_ALPHA])
    fi[r, F_DIRTY] = 1
    fi[r, F_NEWS] = 1
    fi[r, F_LAST_SEEN] = now


# One report (Fabric._report) ---------------------------------------------------------------


@njit(cache=True)
def _fold_report(S, v2, node_id, H, nh, has, loc, has_local, loc_ets, flow, has_flow,
                 plen, now, path):  # fmt: skip
    """`H`: nh hops (newest first) of extracted values; `has`: which columns the layout
    has (H_NODE .. H_TX); `loc`: the reporter's own metadata [latency, egress port, queue
    ID, occupancy, tx] (-1: absent) and `loc_ets` its egress timestamp (has_local bit 1);
    `flow`: [src hi, src lo, dst hi, dst lo, ports word, dport]."""
    c = S[16]
    p = S[17]
    pi = S[18]
    unit = p[P_V2_UNIT] if v2 else p[P_V1_UNIT]
    agg = np.nan
    if has_flow and pi[PI_AGG_PORT] >= 0:
        agg = 1.0 if flow[5] == pi[PI_AGG_PORT] else 0.0
    total = 0.0
    have_lat = False
    npath = 0
    ets_inv = U64MAX if v2 else U32
    has_node, has_ports, has_lat = has[H_NODE], has[H_INPORT], has[H_LAT]
    has_q, has_ets, has_tx = has[H_QUEUE], has[H_ETS], has[H_TX]
    by_bytes = (not has_tx) and has_ets
    mirror = False
    if (not v2) and pi[PI_V1_MIRROR] and nh > 0:
        mirror = (not has_node) or H[0, H_NODE] == np.uint64(node_id)
    for k in range(nh):
        node_ok = has_node and H[k, H_NODE] != U32
        if node_ok:
            path[npath] = np.int64(H[k, H_NODE])
            npath += 1
        if mirror and k == 0:
            c[C_UNATTR] += 1
            continue
        lat = np.nan
        if has_lat and H[k, H_LAT] != U32:
            lat = float(H[k, H_LAT]) * unit
            total += lat
            have_lat = True
        if (not node_ok) or (not has_ports) or (H[k, H_EGPORT] == U16 and H[k, H_INPORT] == U16):
            c[C_UNATTR] += 1
            continue
        q = -1
        occ = -1
        if has_q and H[k, H_QUEUE] != U32:
            v = np.int64(H[k, H_QUEUE])
            q, occ = v >> 24, v & 0xFFFFFF
        node = np.int64(H[k, H_NODE])
        port = np.int64(H[k, H_EGPORT])
        r = _get_link(S, node, port, q)
        if r < 0:
            continue
        util = np.nan
        if by_bytes:
            ts = H[k, H_ETS]
            if ts != ets_inv and plen >= 0:
                util = _util_from_bytes(S, r, ts, v2, unit, plen)
        elif has_tx and H[k, H_TX] != U32:
            util = float(H[k, H_TX]) / p[P_TX_FULL]
        _update_link(S, r, lat, occ, util, agg, now)
    if has_local & 1:
        lat = np.nan
        if loc[0] >= 0:
            lat = float(loc[0]) * unit
            total += lat
            have_lat = True
        if npath == 0 or path[0] != node_id:
            for k in range(npath, 0, -1):
                path[k] = path[k - 1]
            path[0] = node_id
            npath += 1
        if loc[1] >= 0:
            r = _get_link(S, node_id, loc[1], loc[2])
            if r >= 0:
                util = np.nan
                if loc[4] >= 0:
                    util = float(loc[4]) / p[P_TX_FULL]
                elif (has_local & 2) and plen >= 0:
                    util = _util_from_bytes(S, r, loc_ets, v2, unit, plen)
                _update_link(S, r, lat, loc[3], util, agg, now)
    if has_flow and npath > 0:
        _flow(S, flow[0], flow[1], flow[2], flow[3], flow[4], node_id, path, npath,
              total if have_lat else np.nan, now)  # fmt: skip


# The common v2 shape, decoded from the bytes --------------------------------------------------


@njit(cache=True)
def _u16(b, o):
    return (np.int64(b[o]) << 8) | np.int64(b[o + 1])


@njit(cache=True)
def _u32(b, o):
    return (
        (np.int64(b[o]) << 24)
        | (np.int64(b[o + 1]) << 16)
        | (np.int64(b[o + 2]) << 8)
        | (np.int64(b[o + 3]))
    )


@njit(cache=True)
def _u32u(b, o):
    return np.uint64(_u32(b, o))


@njit(cache=True)
def _u64u(b, o):
    return (np.uint64(_u32(b, o)) << np.uint64(32)) | np.uint64(_u32(b, o + 4))


@njit(cache=True)
def _layout(bitmap, v2, offs):
    """Byte offsets of the hop fields in a hop (-1: absent) into offs[0..6]; returns the
    bytes the bitmap asks for. v1 (INT v1.0) has 4-byte timestamps."""
    for k in range(7):
        offs[k] = -1
    o = 0
    for bit in range(15):
        if bitmap & (0x8000 >> bit):
            if bit == 0:
                offs[H_NODE] = o
            elif bit == 1:
                offs[H_INPORT] = o
                offs[H_EGPORT] = o + 2
            elif bit == 2:
                offs[H_LAT] = o
            elif bit == 3:
                offs[H_QUEUE] = o
            elif bit == 5:
                offs[H_ETS] = o
            elif bit == 7:
                offs[H_TX] = o
            o += 8 if bit == 6 or (v2 and bit in (4, 5)) else 4
    if bitmap & 1:
        o += 4  # checksum complement, last
    return o


@njit(cache=True)
def _marked(dscp_field, dport, udp_ports, pi):
    for k in range(udp_ports.shape[0]):
        if udp_ports[k] == dport:
            return True
    if pi[PI_DSCP] < 0:
        return False
    return (dscp_field & pi[PI_DSCP_MASK]) == pi[PI_DSCP]


@njit(cache=True)
def _fast_report(b, start, stop, udp_ports, pi):
    """Checks an individual report of the common shape at `start` (its first byte);
    returns the stack offset or -1. Mirrors Decoder._fast_v2 and _stack_v2."""
    if stop - start - 4 < 52:
        return -1
    if b[start] != 0x14 or b[start + 2] != 0:  # RepType 1, InType 4 (IPv4); MD Length 0
        return -1
    if _u16(b, start + 4) != 0:  # RepMdBits
        return -1
    ip = start + 12
    if b[ip] != 0x45 or b[ip + 9] != 17:
        return -1
    udp = ip + 20
    shim = udp + 8
    if b[shim] & 0xFC != 0x10 or b[shim + 4] >> 4 != 2:
        return -1
    if not _marked(np.int64(b[ip + 1]) >> 2, _u16(b, udp + 2), udp_ports, pi):
        return -1
    hop_ml = np.int64(b[shim + 6]) & 0x1F
    stack_bytes = 4 * np.int64(b[shim + 1]) - 12
    if hop_ml == 0 or stack_bytes <= 0 or start + 56 + stack_bytes > stop:
        return -1
    if _u16(b, shim + 12) != 0:  # DS Instruction
        return -1
    return shim + 16


@njit(cache=True)
def _split_fast(b, end, udp_ports, pi, starts, offs):
    """The individual reports of a datagram if all are of the common shape (their start
    offsets in `starts`): their count, or -1 (then the Python decoder decides)."""
    if end < 12 or b[0] >> 4 != 2:
        return -1
    off = 8
    nrep = 0
    while off + 4 <= end:
        rep_len = np.int64(b[off + 1])
        stop = end if rep_len == 0xFF else off + 4 + 4 * rep_len
        if stop > end or nrep == starts.shape[0] or _fast_report(b, off, stop, udp_ports, pi) < 0:
            return -1
        shim = off + 40
        hop_bytes = 4 * (np.int64(b[shim + 6]) & 0x1F)
        base = _layout(_u16(b, shim + 8), True, offs)
        if hop_bytes < base or (4 * np.int64(b[shim + 1]) - 12) % hop_bytes != 0:
            return -1  # hop_length, or not whole hops: the reference says why
        starts[nrep] = off
        nrep += 1
        off = stop
    return nrep if nrep > 0 else -1


@njit(cache=True)
def _extract(b, st, H, offs, has, flow, meta):
    """One common-shape report at `st`: its hops into H (newest first), which columns the
    layout has, its flow words; meta = [hops, IP total length, bitmap, Hop ML, remaining
    hop count, flags byte]. Returns the hop count."""
    ip = st + 12
    udp = ip + 20
    shim = udp + 8
    bitmap = _u16(b, shim + 8)
    hop_ml = np.int64(b[shim + 6]) & 0x1F
    hop_bytes = 4 * hop_ml
    nh = (4 * np.int64(b[shim + 1]) - 12) // hop_bytes
    _layout(bitmap, True, offs)
    for j in range(7):
        has[j] = offs[j] >= 0
    s0 = shim + 16
    for h in range(nh):
        o = s0 + h * hop_bytes
        for j in range(7):
            if offs[j] >= 0:
                if j == H_ETS:
                    H[h, j] = _u64u(b, o + offs[j])
                elif j in (H_INPORT, H_EGPORT):
                    H[h, j] = np.uint64(_u16(b, o + offs[j]))
                else:
                    H[h, j] = _u32u(b, o + offs[j])
    flow[0] = 0
    flow[1] = _u32(b, ip + 12)
    flow[2] = 0
    flow[3] = _u32(b, ip + 16)
    sport, dport = _u16(b, udp), _u16(b, udp + 2)
    flow[4] = (np.int64(17) << 40) | (sport << 24) | (dport << 8) | 4
    flow[5] = dport
    meta[0] = nh
    meta[1] = _u16(b, ip + 2)
    meta[2] = bitmap
    meta[3] = hop_ml
    meta[4] = np.int64(b[shim + 7])
    meta[5] = np.int64(b[st + 3])
    return nh


# ONOS's v1 shape: fixed header (Len 4, NProto 0), Ethernet, IPv4 (IHL 5), UDP, INT v1.
V1_IP, V1_UDP, V1_SHIM = 30, 50, 58
V1_STACK = V1_SHIM + 12


@njit(cache=True)
def _v1_fast(b, end, udp_ports, pi, offs):
    """The hop size if the datagram is ONOS's common v1 shape with a whole stack, else -1
    (then the Python decoder decides). Mirrors Decoder._v1, _packet, _int_v1, _stack_v1."""
    if end < V1_STACK:
        return -1
    w0 = _u32(b, 0)
    if (w0 >> 24) & 0x0F != 4 or (w0 >> 21) & 0x7 != 0:  # Len 4 words, NProto Ethernet
        return -1
    if _u16(b, 28) != 0x0800 or b[V1_IP] != 0x45 or b[V1_IP + 9] != 17:
        return -1
    if not _marked(np.int64(b[V1_IP + 1]) >> 2, _u16(b, V1_UDP + 2), udp_ports, pi):
        return -1
    if b[V1_SHIM] != 1 or b[V1_SHIM + 4] >> 4 > 1:  # INT-MD; INT header version 0 or 1
        return -1
    hop_ml = np.int64(b[V1_SHIM + 6]) & 0x1F
    declared = 4 * np.int64(b[V1_SHIM + 2]) - 12
    if hop_ml == 0 or declared <= 0 or V1_STACK + declared > end:
        return -1
    bitmap = _u16(b, V1_SHIM + 8)
    base = _layout(bitmap, False, offs)
    hop_bytes = 4 * hop_ml
    if (
        bitmap & 0x0200 and hop_ml == _popcount16(bitmap) and hop_bytes < base
        and declared % base == 0
    ):  # fmt: skip
        hop_bytes = base  # ONOS counts bits; the L2 ports take two words
    if hop_bytes < base or declared % hop_bytes != 0:
        return -1
    return hop_bytes


@njit(cache=True)
def _popcount16(x):
    n = 0
    for k in range(16):
        n += (x >> k) & 1
    return n


@njit(cache=True)
def _extract_v1(b, hop_bytes, H, offs, has, flow, meta):
    """The one report of a v1 datagram (see _extract); returns its hop count."""
    bitmap = _u16(b, V1_SHIM + 8)
    nh = (4 * np.int64(b[V1_SHIM + 2]) - 12) // hop_bytes
    _layout(bitmap, False, offs)
    for j in range(7):
        has[j] = offs[j] >= 0
    for h in range(nh):
        o = V1_STACK + h * hop_bytes
        for j in range(7):
            if offs[j] >= 0:
                if j in (H_INPORT, H_EGPORT):
                    H[h, j] = np.uint64(_u16(b, o + offs[j]))
                else:
                    H[h, j] = _u32u(b, o + offs[j])
    flow[0] = 0
    flow[1] = _u32(b, V1_IP + 12)
    flow[2] = 0
    flow[3] = _u32(b, V1_IP + 16)
    sport, dport = _u16(b, V1_UDP), _u16(b, V1_UDP + 2)
    flow[4] = (np.int64(17) << 40) | (sport << 24) | (dport << 8) | 4
    flow[5] = dport
    w0 = _u32(b, 0)
    meta[0] = nh
    meta[1] = _u16(b, V1_IP + 2)
    meta[2] = bitmap
    meta[3] = np.int64(b[V1_SHIM + 6]) & 0x1F
    meta[4] = np.int64(b[V1_SHIM + 7])
    meta[5] = ((w0 >> 7) & 0x80) | ((w0 >> 7) & 0x40) | ((w0 >> 7) & 0x20)  # D, Q, F
    return nh


@njit(cache=True)
def process_batch(S, bufs, lens, first, n, now, udp_ports, H, path, flow, loc, offs, has):
    """Decode and fold datagrams first.. of a batch until one is not of a common shape;
    returns its index (n: all done). That one is the Python decoder's, and then this goes
    on after it: state sees the datagrams in the order they arrived."""
    c = S[16]
    pi = S[18]
    starts = np.empty(MAX_REPORTS, np.int64)
    meta = np.empty(6, np.int64)
    for d in range(first, n):
        b = bufs[d]
        end = lens[d]
        ver = b[0] >> 4 if end > 0 else 0
        if ver == 1:
            hop_bytes = _v1_fast(b, end, udp_ports, pi, offs)
            if hop_bytes < 0:
                return d
            c[C_DATAGRAMS] += 1
            c[C_BYTES] += end
            sw = _u32(b, 4)
            nh = _extract_v1(b, hop_bytes, H, offs, has, flow, meta)
            names = has[H_NODE] and nh > 0 and np.int64(H[0, H_NODE]) == sw
            if not _observe_header(S, sw, _u32(b, 0) & 0x3F, _u32(b, 8), _u32(b, 12), True,
                                   False, names):  # fmt: skip
                continue
            _fold_report(S, False, sw, H, nh, has, loc, 0, np.uint64(0), flow, True, meta[1],
                         now, path)  # fmt: skip
            c[C_DECODED] += 1
            continue
        nrep = _split_fast(b, end, udp_ports, pi, starts, offs)
        if nrep < 0:
            return d
        c[C_DATAGRAMS] += 1
        c[C_BYTES] += end
        w0 = _u32(b, 0)
        node_id = _u32(b, 4)
        hw, seq = (w0 >> 22) & 0x3F, w0 & 0x3FFFFF
        # The first report names its sender: its newest hop's node ID.
        shim0 = starts[0] + 40
        _layout(_u16(b, shim0 + 8), True, offs)
        names = offs[H_NODE] >= 0 and _u32(b, shim0 + 16 + offs[H_NODE]) == node_id
        if not _observe_header(S, node_id, hw, seq, 0, False, True, names):
            continue
        for k in range(nrep):
            nh = _extract(b, starts[k], H, offs, has, flow, meta)
            _fold_report(S, True, node_id, H, nh, has, loc, 0, np.uint64(0), flow, True,
                         meta[1], now, path)  # fmt: skip
        c[C_DECODED] += nrep
    return n


@njit(cache=True)
def decode_common(b, end, udp_ports, pi, H, out):
    """For tests: the fields the compiled path reads from one datagram, or -1 if it
    leaves the datagram to the Python decoder. out[k] = [node, hw, seq, *flow words,
    *meta, *has, hop row offset into H, family, v1 ingress timestamp]."""
    starts = np.empty(MAX_REPORTS, np.int64)
    offs = np.empty(7, np.int64)
    has = np.empty(7, np.bool_)
    flow = np.empty(6, np.int64)
    meta = np.empty(6, np.int64)
    if end > 0 and b[0] >> 4 == 1:
        hop_bytes = _v1_fast(b, end, udp_ports, pi, offs)
        if hop_bytes < 0:
            return -1
        _extract_v1(b, hop_bytes, H, offs, has, flow, meta)
        out[0, 0] = _u32(b, 4)
        out[0, 1] = _u32(b, 0) & 0x3F
        out[0, 2] = _u32(b, 8)
        starts[0] = -1
        nrep = 1
    else:
        nrep = _split_fast(b, end, udp_ports, pi, starts, offs)
        if nrep < 0:
            return -1
    w0 = _u32(b, 0)
    row = 0
    for k in range(nrep):
        if starts[0] >= 0:
            nh = _extract(b, starts[k], H[row:], offs, has, flow, meta)
            out[k, 0] = _u32(b, 4)
            out[k, 1] = (w0 >> 22) & 0x3F
            out[k, 2] = w0 & 0x3FFFFF
            out[k, 23] = 2
        else:
            nh = meta[0]
            out[k, 23] = 1
            out[k, 24] = _u32(b, 12)
        for j in range(6):
            out[k, 3 + j] = flow[j]
        for j in range(6):
            out[k, 9 + j] = meta[j]
        for j in range(7):
            out[k, 15 + j] = has[j]
        out[k, 22] = row
        row += nh
    return nrep


# Change detection (Fabric.due_points) -------------------------------------------------------


@njit(cache=True)
def _moved(new, old, absolute, relative):
    if math.isnan(new):
        return False
    if math.isnan(old):
        return True
    return abs(new - old) >= max(absolute, relative * abs(old))


@njit(cache=True)
def due_links(S, now, force, out_rows, out_f, out_i):
    """Rows of links to write, with their values before the reset; returns the count."""
    lf = S[0]
    li = S[1]
    p = S[17]
    rel, counted = p[P_REL], p[P_UNWRITTEN]
    k = 0
    for r in range(li.shape[0]):
        if li[r, LSTATE] != BORN or li[r, SAMPLES] == 0:
            continue
        written = li[r, L_HAS_WRITTEN] == 1
        if not force and written and now - lf[r, L_WRITTEN_AT] < counted:
            if not li[r, DIRTY]:
                continue
            li[r, DIRTY] = 0
            if not (
                _moved(lf[r, LAT], lf[r, W_LAT], p[P_LAT_THR], rel)
                or _moved(lf[r, Q], lf[r, W_Q], p[P_Q_THR], rel)
                or _moved(lf[r, UTIL], lf[r, W_UTIL], p[P_U_THR], rel)
                or _moved(lf[r, AGG], lf[r, W_AGG], p[P_U_THR], rel)
            ):
                continue
        li[r, DIRTY] = 0
        out_rows[k] = r
        for j in range(6):
            out_f[k, j] = lf[r, j]
        out_i[k, 0] = li[r, SAMPLES]
        out_i[k, 1] = li[r, LAST_SEEN]
        k += 1
        lf[r, W_LAT], lf[r, W_Q], lf[r, W_UTIL], lf[r, W_AGG] = (
            lf[r, LAT],
            lf[r, Q],
            lf[r, UTIL],
            lf[r, AGG],
        )
        li[r, L_HAS_WRITTEN] = 1
        lf[r, L_WRITTEN_AT] = now
        li[r, SAMPLES] = 0
        lf[r, LATMAX] = 0.0
        lf[r, QMAX] = 0.0
    return k


@njit(cache=True)
def due_flows(S, now, force, out_rows, out_lat):
    fi = S[5]
    ff = S[6]
    sw = S[14]
    c = S[16]
    p = S[17]
    rel, keepalive = p[P_REL], p[P_KEEPALIVE]
    budget = S[18][PI_FLOW_POINTS]
    k = 0
    r = c[C_FHEAD]
    while r >= 0:
        nxt = fi[r, F_NEXT]
        if fi[r, F_NEWS] and _set_has(sw, fi[r, F_SINK]):
            if not force and k >= budget:
                break
            write = True
            if not force and fi[r, F_HAS_WRITTEN] and now - ff[r, F_WRITTEN_AT] < keepalive:
                if not fi[r, F_DIRTY]:
                    write = False
                else:
                    fi[r, F_DIRTY] = 0
                    if (
                        fi[r, F_W_PHASH] == fi[r, F_PHASH] and fi[r, F_W_PLEN] == fi[r, F_PLEN]
                        and not _moved(ff[r, F_LAT], ff[r, F_W_LAT], p[P_LAT_THR], rel)
                    ):  # fmt: skip
                        write = False
            if write:
                fi[r, F_DIRTY] = 0
                fi[r, F_NEWS] = 0
                out_rows[k] = r
                out_lat[k] = ff[r, F_LAT]
                k += 1
                fi[r, F_W_PHASH] = fi[r, F_PHASH]
                fi[r, F_W_PLEN] = fi[r, F_PLEN]
                ff[r, F_W_LAT] = ff[r, F_LAT]
                fi[r, F_HAS_WRITTEN] = 1
                ff[r, F_WRITTEN_AT] = now
        r = nxt
    return k


@njit(cache=True)
def due_trackers(S, now, force, out_rows):
    ti = S[10]
    tf = S[11]
    p = S[17]
    counted = p[P_UNWRITTEN]
    k = 0
    for r in range(ti.shape[0]):
        if not ti[r, T_USED] or ti[r, T_PENDING]:
            continue
        if ti[r, T_RECEIVED] == ti[r, T_W_RECEIVED]:
            continue
        if (
            not force and ti[r, T_HAS_WRITTEN] and ti[r, T_W_LOST] == ti[r, T_LOST]
            and now - tf[r, 0] < counted
        ):  # fmt: skip
            continue
        out_rows[k] = r
        k += 1
        ti[r, T_HAS_WRITTEN] = 1
        ti[r, T_W_LOST] = ti[r, T_LOST]
        tf[r, 0] = now
        ti[r, T_W_RECEIVED] = ti[r, T_RECEIVED]
    return k


# recvmmsg ------------------------------------------------------------------------------------


class _Iovec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class _Msghdr(ctypes.Structure):
    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    )


class _Mmsghdr(ctypes.Structure):
    _fields_ = (("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint))


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p)
_recvmmsg.restype = ctypes.c_int
MSG_DONTWAIT = 0x40


class Receiver:
    """`recvmmsg` into a preallocated batch: one system call for up to BATCH datagrams."""

    def __init__(self, sock: socket.socket, batch: int = BATCH) -> None:
        self.fd = sock.fileno()
        self.bufs = np.zeros((batch, SLOT), np.uint8)
        self.lens = np.zeros(batch, np.int64)
        self._iov = (_Iovec * batch)()
        self._msgs = (_Mmsghdr * batch)()
        base = self.bufs.ctypes.data
        for k in range(batch):
            self._iov[k].iov_base = base + k * SLOT
            self._iov[k].iov_len = SLOT
            self._msgs[k].msg_hdr.msg_iov = ctypes.pointer(self._iov[k])
            self._msgs[k].msg_hdr.msg_iovlen = 1
        self._ptr = ctypes.addressof(self._msgs)
        self.batch = batch
        # msg_len of every header, as a strided view: copied out in one numpy operation
        # (a Python loop over the headers cost ~0.15 µs a datagram).
        words = ctypes.sizeof(_Mmsghdr) // 4
        self._msg_len = np.frombuffer(self._msgs, np.uint32).reshape(batch, words)[
            :, _Mmsghdr.msg_len.offset // 4
        ]

    def recv(self) -> int:
        """Datagrams read (0 when none is waiting)."""
        n = _recvmmsg(self.fd, self._ptr, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (11, 4):  # EAGAIN, EINTR
                return 0
            raise OSError(err, "recvmmsg")
        self.lens[:n] = self._msg_len[:n]
        return n


# The Python face -----------------------------------------------------------------------------


def _flow_words(f: Flow) -> tuple[int, int, int, int, int]:
    def split(a: bytes) -> tuple[int, int]:
        v = int.from_bytes(a, "big")
        hi, lo = v >> 64, v & 0xFFFFFFFFFFFFFFFF
        return _s64(hi), _s64(lo)

    sh, sl = split(f.src)
    dh, dl = split(f.dst)
    ports = (f.proto << 40) | (f.sport << 24) | (f.dport << 8) | len(f.src)
    return sh, sl, dh, dl, ports


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _flow_text_of(sh: int, sl: int, dh: int, dl: int, ports: int) -> str:
    """`flow_text(_flow_of(words))` without the objects: IPv4 formatted from the words
    directly (a flow point cost ~6 µs of the two before; issue 29's many flows)."""
    if ports & 0xFF != 4:
        return flow_text(_flow_of(np.array((sh, sl, dh, dl, ports), np.int64)))
    s, d = sl & 0xFFFFFFFF, dl & 0xFFFFFFFF
    return (
        f"{s >> 24}.{(s >> 16) & 255}.{(s >> 8) & 255}.{s & 255}:{(ports >> 24) & 0xFFFF}>"
        f"{d >> 24}.{(d >> 16) & 255}.{(d >> 8) & 255}.{d & 255}:{(ports >> 8) & 0xFFFF}"
        f"/{(ports >> 40) & 0xFF}"
    )


def _flow_of(words: np.ndarray) -> Flow:
    sh, sl, dh, dl, ports = (int(x) & 0xFFFFFFFFFFFFFFFF for x in words)
    alen = ports & 0xFF
    src = ((sh << 64) | sl).to_bytes(16, "big")[-alen:]
    dst = ((dh << 64) | dl).to_bytes(16, "big")[-alen:]
    return Flow(src, dst, (ports >> 40) & 0xFF, (ports >> 24) & 0xFFFF, (ports >> 8) & 0xFFFF)


class FastFabric:
    """`state.Fabric`'s state in arrays, folded by compiled code; same interface."""

    def __init__(self, settings: Settings, worker: int = 0, workers: int = 1) -> None:
        s = self.s = settings
        self._stamp_rem, self._stamp_mod = worker, workers
        self._last_time_ns = 0
        lrows = s.max_links + s.max_pending_links + 1
        frows = s.max_flows + 1
        trows = s.max_links + 1
        self.lf = np.full((lrows, NLF), np.nan)
        self.li = np.zeros((lrows, NLI), np.int64)
        self.lu = np.zeros((lrows, 2), np.uint64)
        self.lht = np.zeros(_pow2(2 * lrows), np.int64)
        self.lfree = np.arange(lrows - 1, -1, -1, dtype=np.int64)
        self.fi = np.zeros((frows, NFI), np.int64)
        self.ff = np.full((frows, NFF), np.nan)
        self.fp = np.zeros((frows, MAXPATH), np.uint32)
        self.fht = np.zeros(_pow2(2 * frows), np.int64)
        self.ffree = np.arange(frows - 1, -1, -1, dtype=np.int64)
        self.ti = np.zeros((trows, NTI), np.int64)
        self.tf = np.zeros((trows, 1))
        self.tht = np.zeros(_pow2(2 * trows), np.int64)
        self.tfree = np.arange(trows - 1, -1, -1, dtype=np.int64)
        self.sw = np.zeros(_pow2(2 * trows), np.int64)
        allowed = sorted(set(s.allowed_switches))
        self.allowed = np.zeros(_pow2(2 * len(allowed) + 2), np.int64)
        for a in allowed:
            _set_add(self.allowed, np.int64(a))
        c = self.c = np.zeros(NC, np.int64)
        c[[C_PHEAD, C_PTAIL, C_FHEAD, C_FTAIL, C_SHEAD, C_STAIL]] = -1
        c[C_LFREE], c[C_FFREE], c[C_SFREE] = lrows, frows, trows
        self.p = np.array([
            s.ewma_alpha, s.v2_time_unit_ns, s.v1_time_unit_ns, s.tx_utilization_full_scale,
            s.link_speed_bps, s.utilization_window_ns, s.latency_threshold_ns,
            s.queue_threshold, s.utilization_threshold, s.relative_threshold, s.keepalive_s,
            unwritten_limit(s),
        ])  # fmt: skip
        min_reports = s.link_min_reports
        self.pi = np.array([
            s.max_links, s.max_flows, s.max_pending_links, min_reports,
            int(not allowed and min_reports > 1),
            -1 if s.aggregation_udp_port is None else s.aggregation_udp_port,
            int(s.v1_sink_hop_is_mirror),
            -1 if s.int_dscp is None else s.int_dscp & s.int_dscp_mask, s.int_dscp_mask,
            int(bool(allowed)), s.max_flow_points,
        ], np.int64)  # fmt: skip
        self.udp_ports = np.array(sorted(s.int_udp_ports), np.int64)
        self.S = (
            self.lf, self.li, self.lu, self.lht, self.lfree, self.fi, self.ff, self.fp,
            self.fht, self.ffree, self.ti, self.tf, self.tht, self.tfree, self.sw,
            self.allowed, c, self.p, self.pi,
        )  # fmt: skip
        # Scratch
        self._H = np.zeros((256, 7), np.uint64)
        self._path = np.zeros(MAXPATH + 1, np.int64)
        self._flow = np.zeros(6, np.int64)
        self._loc = np.zeros(5, np.int64)
        self._offs = np.zeros(7, np.int64)
        self._has = np.zeros(7, np.bool_)

    # Counters, as Fabric has them ------------------------------------------------------------

    @property
    def links_full(self) -> int:
        return int(self.c[C_LINKS_FULL])

    @property
    def hops_unattributed(self) -> int:
        return int(self.c[C_UNATTR])

    @property
    def hops_implausible(self) -> int:
        return int(self.c[C_IMPLAUS])

    @property
    def lost_total(self) -> int:
        return int(self.c[C_LOST])

    @property
    def flows_evicted(self) -> int:
        return int(self.c[C_FEVICT])

    @property
    def flows_evicted_unwritten(self) -> int:
        return int(self.c[C_FEVICT_UNW])

    def counts(self) -> dict[str, int]:
        c = self.c
        return {"links": int(c[C_LINKS]), "flows": int(c[C_FLOWS]),
                "links_pending": int(c[C_PENDING])}  # fmt: skip

    def lost_per_switch(self) -> dict[str, int]:
        # A copy first: the receive loop (compiled, without the GIL) writes these columns
        # meanwhile, and np.nonzero on the live column raised "number of non-zero array
        # elements changed during function execution", which killed the snapshot thread.
        ti = self.ti[:, [T_USED, T_NODE, T_LOST]].copy()
        out: dict[str, int] = {}
        for r in np.nonzero(ti[:, 0])[0]:
            node = str(int(ti[r, 1]))
            out[node] = out.get(node, 0) + int(ti[r, 2])
        return out

    def link_keys(self) -> set[tuple[int, int, int | None]]:
        li = self.li
        return {
            (int(li[r, NODE]), int(li[r, PORT]), None if li[r, QUEUE] < 0 else int(li[r, QUEUE]))
            for r in np.nonzero(li[:, LSTATE] == BORN)[0]
        }

    # Folding ---------------------------------------------------------------------------------

    def ingest(
        self,
        bufs: np.ndarray,
        lens: np.ndarray,
        n: int,
        now_ns: int,
        slow: Callable[[bytes, int], None],
    ) -> tuple[int, int, int]:
        """Fold a batch, in order; `slow(datagram, now_ns)` takes each datagram the compiled
        path leaves to the Python decoder (and counts it). Returns what the compiled path
        did: (datagrams, reports decoded, datagrams rejected by allowed_switches)."""
        c = self.c
        dg0, dec0, rej0 = c[C_DATAGRAMS], c[C_DECODED], c[C_REJECTED]
        i = 0
        while i < n:
            i = process_batch(self.S, bufs, lens, i, n, now_ns, self.udp_ports, self._H,
                              self._path, self._flow, self._loc, self._offs, self._has)  # fmt: skip
            if i < n:
                slow(bufs[i, : lens[i]].tobytes(), now_ns)
                i += 1
        return (int(c[C_DATAGRAMS] - dg0), int(c[C_DECODED] - dec0),
                int(c[C_REJECTED] - rej0))  # fmt: skip

    def observe(self, r: Report, now_ns: int) -> None:
        self.observe_datagram((r,), now_ns)

    def observe_datagram(self, reports: Sequence[Report], now_ns: int) -> None:
        """Fold the reports the Python decoder made of one datagram (Fabric's semantics)."""
        if not reports:
            return
        r = reports[0]
        v1 = r.family == "v1"
        ok = _observe_header(
            self.S, r.node_id, r.hw_id, r.seq, r.ingress_ts or 0, v1, not v1, _names_itself(r)
        )
        if not ok:  # counted by the caller, as a DecodeError is
            self.c[C_REJECTED] -= 1
            raise Rejected("switch_not_allowed", f"node {r.node_id} is not in allowed_switches")
        for r in reports:
            self._fold(r, now_ns)

    def _fold(self, r: Report, now_ns: int) -> None:
        H, has, loc, flow = self._H, self._has, self._loc, self._flow
        lay = r.layout
        nh = r.hop_count if lay is not None else 0
        if nh > H.shape[0]:
            self._H = H = np.zeros((nh, 7), np.uint64)
        has[:] = False
        if lay is not None and nh:
            idx = lay.index
            cols = (
                (H_NODE, "node_id"), (H_INPORT, "ingress_port"), (H_EGPORT, "egress_port"),
                (H_LAT, "hop_latency"), (H_QUEUE, "queue"), (H_ETS, "egress_ts"),
                (H_TX, "tx_utilization"),
            )  # fmt: skip
            st, w = r.stack, lay.width
            for col, name in cols:
                i = idx.get(name, -1)
                if i < 0:
                    continue
                has[col] = True
                H[:nh, col] = st[i : w * nh : w]
        has_local = 0
        ets = np.uint64(0)
        if r.local is not None:
            x = r.local
            has_local = 1
            loc[0] = -1 if x.hop_latency is None else x.hop_latency
            loc[1] = -1 if x.egress_port is None else x.egress_port
            loc[2] = -1 if x.queue_id is None else x.queue_id
            loc[3] = -1 if x.queue_occupancy is None else x.queue_occupancy
            loc[4] = -1 if x.tx_utilization is None else x.tx_utilization
            if x.egress_ts is not None:
                has_local |= 2
                ets = np.uint64(x.egress_ts)
        if r.flow is not None:
            flow[:5] = _flow_words(r.flow)
            flow[5] = r.flow.dport
        _fold_report(
            self.S, r.family == "v2", r.node_id, H, nh, has, loc, has_local, ets, flow,
            r.flow is not None, -1 if r.packet_length is None else r.packet_length, now_ns,
            self._path,
        )  # fmt: skip

    # Change detection ------------------------------------------------------------------------

    def _stamp(self, t: int) -> int:
        t = max(t, self._last_time_ns + 1)
        if self._stamp_mod > 1:
            t += (self._stamp_rem - t) % self._stamp_mod
        self._last_time_ns = t
        return t

    def due_points(self, now: float | None = None, force: bool = False) -> list[Point]:
        now = time.time() if now is None else now
        out: list[Point] = []
        n_links = int(self.c[C_LINKS])
        rows = np.zeros(max(1, n_links), np.int64)
        vals = np.zeros((max(1, n_links), 6))
        ints = np.zeros((max(1, n_links), 2), np.int64)
        k = due_links(self.S, now, force, rows, vals, ints)
        li = self.li
        for j in range(k):
            r = rows[j]
            lat, latmax, q, qmax, util, agg = (float(x) for x in vals[j])
            fields: dict[str, float | int | str] = {"samples": int(ints[j, 0])}
            if not math.isnan(lat):
                fields["latency_ns"] = lat
                fields["latency_max_ns"] = latmax
            if not math.isnan(q):
                fields["queue_occupancy"] = q
                fields["queue_occupancy_max"] = qmax
            if not math.isnan(util):
                fields["utilization"] = util
                if li[r, UHAS]:
                    fields["utilization_from_bytes"] = True
            if not math.isnan(agg):
                fields["aggregation_share"] = agg
            tags = {"switch": str(int(li[r, NODE])), "port": str(int(li[r, PORT]))}
            if li[r, QUEUE] >= 0:
                tags["queue"] = str(int(li[r, QUEUE]))
            out.append(Point("int_link", tags, fields, self._stamp(int(ints[j, 1]))))
        n_flows = int(self.c[C_FLOWS])
        frows = np.zeros(max(1, n_flows), np.int64)
        flat = np.zeros(max(1, n_flows))
        k = due_flows(self.S, now, force, frows, flat)
        fi, fp = self.fi, self.fp
        words = fi[frows[:k], F_SRC_HI : F_PORTS + 1].tolist()
        for j in range(k):
            r = frows[j]
            plen = int(fi[r, F_PLEN])
            fields = {
                "flow": _flow_text_of(*words[j]), "path": ",".join(map(str, fp[r, :plen].tolist())),
                "hops": plen,
            }  # fmt: skip
            if not math.isnan(flat[j]):
                fields["latency_ns"] = float(flat[j])
            out.append(
                Point("int_flow", {"switch": str(int(fi[r, F_SINK]))}, fields,
                      self._stamp(int(fi[r, F_LAST_SEEN])))
            )  # fmt: skip
        trows = np.zeros(max(1, int(self.c[C_SEQ])), np.int64)
        k = due_trackers(self.S, now, force, trows)
        ti = self.ti
        now_ns = time.time_ns()
        for j in range(k):
            r = trows[j]
            fields = {"received": int(ti[r, T_RECEIVED]), "lost": int(ti[r, T_LOST]),
                      "repeated": int(ti[r, T_REPEATED])}  # fmt: skip
            tags = {"switch": str(int(ti[r, T_NODE])), "hw_id": str(int(ti[r, T_HW]))}
            out.append(Point("int_reports", tags, fields, self._stamp(now_ns)))
        return out


def warm() -> None:
    """Compile (or load from numba's cache) everything the receive path runs."""
    from .settings import load_settings
    from .wire import Decoder, Hop, int_md_v2, report_v2, udp_int_packet

    f = FastFabric(load_settings(None, max_links=64, max_flows=16, max_pending_links=16))
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1, 48879)
    hop = Hop(node_id=1, ingress_port=1, egress_port=2, hop_latency=3, queue_id=0,
              queue_occupancy=1, egress_ts=5)  # fmt: skip
    data = report_v2(1, 0, udp_int_packet(flow, int_md_v2(0xF400, [hop])))
    bufs = np.zeros((1, SLOT), np.uint8)
    bufs[0, : len(data)] = np.frombuffer(data, np.uint8)
    f.ingest(bufs, np.array([len(data)], np.int64), 1, 1, lambda d, t: None)
    f.observe_datagram(Decoder().decode(data), 1)
    f.due_points(1.0, force=True)
