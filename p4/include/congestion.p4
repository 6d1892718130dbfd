/* ==========================================================================
 * Congestion feedback for training traffic (docs/congestion.md).
 *
 * Explicit: every aggregation packet that is not an acknowledgement carries in
 * agg.max_queue the longest egress queue (packets, saturating at 255) it waited behind on
 * its way; each hop raises it to its own queue, so the most congested hop wins. The
 * receiver echoes it in its acknowledgement and the sender sets its window from it
 * (agg_agent.congestion). A queue, not a rate: bmv2 has no tx rate of its own (int.p4
 * measures one per 1 ms window for INT packets only), and a queue above zero already
 * says the port is saturated; the sender aims at a small target queue.
 *
 * Baseline (DCTCP): an ECN-capable IPv4 packet that finds a queue of at least K packets
 * leaves marked CE. K is the keyless table's default action, set by the control plane; 0
 * (the default) turns marking off.
 *
 * Only egress state is read (standard_metadata.enq_qdepth, the depth of the packet's own
 * queue when it was enqueued): no register, so nothing the control plane must read.
 * ========================================================================== */
#ifndef INNET_AGG_CONGESTION_P4
#define INNET_AGG_CONGESTION_P4

#include "headers.p4"

control CongestionFeedback(inout headers_t hdr, inout local_metadata_t local_metadata,
                           inout standard_metadata_t standard_metadata) {

    bit<19> ecn_threshold = 0;

    action set_ecn_threshold(bit<19> packets) {
        ecn_threshold = packets;
    }

    table ecn_marking {
        key = {}
        actions = { set_ecn_threshold; }
        default_action = set_ecn_threshold(0);
    }

    apply {
        if (standard_metadata.instance_type != PKT_INSTANCE_TYPE_NORMAL) {
            return;
        }
        bit<19> q = standard_metadata.enq_qdepth;
        if (hdr.agg.isValid() && (hdr.agg.flags & AGG_FLAG_ACK) == 0) {
            bit<8> seen = 255;
            if (q < 255) {
                seen = (bit<8>)q;
            }
            if (seen > hdr.agg.max_queue) {
                hdr.agg.max_queue = seen;
                hdr.udp.checksum = 0;  // a zero UDP checksum over IPv4 means "none"
            }
        }
        // The table is looked up only for ECN-capable packets: a lookup per packet costs
        // bmv2 more than the rest of this block.
        if (hdr.ipv4.isValid() && hdr.ipv4.ecn != 0) {
            ecn_marking.apply();
            if (ecn_threshold != 0 && q >= ecn_threshold) {
                hdr.ipv4.ecn = 3;  // CE; the IPv4 checksum is recomputed in ComputeChecksumImpl
            }
        }
    }
}

#endif
