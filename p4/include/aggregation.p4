/* ==========================================================================
 * In-network aggregation (docs/protocols.md, "Aggregation protocol").
 *
 * A job configured here (agg_job) owns slots [pool_base, pool_base + pool_size) of the
 * switch's AGG_SLOTS. A packet's slot holds one chunk (identified by run and seq) at a
 * time:
 *   slot of another run            -> what it holds is another run's (a killed run's
 *                                     partial sum, or an earlier run's): discarded, and
 *                                     the slot claimed for this run and seq
 *   free slot, new seq             -> claim it, add the vector, remember seq
 *   slot holds this seq            -> add the vector unless a contributor is already in
 *                                     the slot's bitmap; then, a retransmission flushes
 *                                     the slot (its partial sum goes up, the slot is
 *                                     freed), anything else is a duplicate and dropped
 *   free slot, same seq as the last -> a late retransmission of a chunk already sent up:
 *   completed chunk                    forwarded unchanged, so the parameter server can
 *                                     complete from raw packets if the aggregate was lost
 *   slot holds an older seq        -> what it holds is stale (a sender reuses a slot only
 *                                     once the parameter server completed its previous
 *                                     chunk): discarded, and the slot claimed as if free
 *   slot holds a newer seq         -> forwarded unchanged (the parameter server acknowledges
 *                                     a chunk it completed again, or completes it raw)
 * When fan_in child streams have been added, the sum goes to next_hop_port in this
 * packet and the slot is zeroed: the data plane frees its own slots, so the control plane
 * never reads registers (bmv2's P4Runtime server cannot).
 * A job without an entry, acknowledgements, joins and slots outside the pool pass through.
 * ========================================================================== */
#ifndef INNET_AGG_AGGREGATION_P4
#define INNET_AGG_AGGREGATION_P4

#include "headers.p4"

control Aggregation(inout headers_t hdr, inout local_metadata_t local_metadata,
                    inout standard_metadata_t standard_metadata) {

    register<bit<32>>(AGG_LANE_CELLS) agg_values;  // cell (slot << 5) + lane
    register<bit<32>>(AGG_SLOTS) agg_bitmap;       // workers already summed in the slot
    register<bit<8>>(AGG_SLOTS) agg_count;         // child streams summed; 0 = free
    register<bit<32>>(AGG_SLOTS) agg_seq;          // seq + 1 of the slot's chunk; 0 = never used
    register<bit<32>>(AGG_SLOTS) agg_run;          // run of the slot's chunk; 0 = never used

    bit<32> job_pool_base = 0;
    bit<16> job_pool_size = 0;
    bit<8>  job_fan_in = 0;
    port_t  job_next_hop_port = 0;

    action set_job(bit<32> pool_base, bit<16> pool_size, bit<8> fan_in, port_t next_hop_port) {
        job_pool_base = pool_base;
        job_pool_size = pool_size;
        job_fan_in = fan_in;
        job_next_hop_port = next_hop_port;
    }

    table agg_job {
        key = { hdr.agg.job_id : exact @name("job_id"); }
        actions = { set_job; @defaultonly NoAction; }
        const default_action = NoAction();
        size = AGG_JOBS;
    }

    apply {
        if ((hdr.agg.flags & (AGG_FLAG_ACK | AGG_FLAG_JOIN)) != 0) {
            return;
        }
        // A chunk of another size than AGG_LANES values (the hosts' larger chunks, for a
        // job the PS sums) is not this switch's to add: forwarded as it came.
        bit<16> int_bytes = 0;
        if (hdr.int_shim.isValid()) {
            int_bytes = ((bit<16>)hdr.int_shim.len + 1) << 2;
        }
        if (hdr.udp.len != AGG_UDP_LEN + int_bytes) {
            return;
        }
        if (!agg_job.apply().hit || hdr.agg.slot >= job_pool_size) {
            return;
        }
        bit<32> slot = job_pool_base + (bit<32>)hdr.agg.slot;
        bit<32> stored_seq;
        bit<32> stored_run;
        bit<8>  count;
        bit<32> bitmap;
        agg_seq.read(stored_seq, slot);
        agg_run.read(stored_run, slot);
        agg_count.read(count, slot);
        agg_bitmap.read(bitmap, slot);
        bit<32> tag = hdr.agg.seq + 1;
        bool fresh = false;  // the slot is (re)claimed: what it holds is discarded
        if (stored_run != hdr.agg.run) {
            // Another run's leftovers: never added to (a job restarted on its number starts
            // its seq at 0 again, and would otherwise complete its killed run's partial sums).
            agg_run.write(slot, hdr.agg.run);
            agg_seq.write(slot, tag);
            fresh = true;
            count = 0;
            bitmap = 0;
        } else if (count == 0) {
            if (stored_seq == tag) {
                return;
            }
            agg_seq.write(slot, tag);
        } else if (stored_seq != tag) {
            // Sequence numbers compared modulo 2^32: the slot's chunk is older when the
            // difference is below 2^31.
            bit<32> ahead = tag - stored_seq;
            if (ahead[31:31] == 1) {
                return;
            }
            agg_seq.write(slot, tag);
            fresh = true;
            count = 0;
            bitmap = 0;
        }
        // A contributor already in the slot: a duplicate, unless it is a retransmission,
        // whose sender waits for an acknowledgement that only a sum reaching the parameter
        // server can bring (the other contributors may never send this chunk again, e.g.
        // after their acknowledgement came through another aggregator, docs/e2e.md). The
        // slot's partial sum goes up in this packet and the slot is freed.
        bool overlap = (bitmap & hdr.agg.contributors) != 0;
        bool flush = overlap && (hdr.agg.flags & AGG_FLAG_RETRANSMIT) != 0;
        if (overlap && !flush) {
            mark_to_drop(standard_metadata);
            exit;
        }
        if (!flush) {
            count = count + 1;
            bitmap = bitmap | hdr.agg.contributors;
        }
        bool complete = flush || count >= job_fan_in;
        bit<32> base = slot << 5;
        bit<32> acc;
        // Masks rather than a branch per lane: what the slot keeps, what the packet adds.
        bit<32> keep = fresh ? 32w0 : 32w0xffffffff;
        bit<32> add = flush ? 32w0 : 32w0xffffffff;
#define LANE(i) \
        agg_values.read(acc, base + i); \
        acc = (acc & keep) + (hdr.agg_values[i].v & add); \
        if (complete) { hdr.agg_values[i].v = acc; acc = 0; } \
        agg_values.write(base + i, acc);
        LANE(0)
        LANE(1)
        LANE(2)
        LANE(3)
        LANE(4)
        LANE(5)
        LANE(6)
        LANE(7)
        LANE(8)
        LANE(9)
        LANE(10)
        LANE(11)
        LANE(12)
        LANE(13)
        LANE(14)
        LANE(15)
        LANE(16)
        LANE(17)
        LANE(18)
        LANE(19)
        LANE(20)
        LANE(21)
        LANE(22)
        LANE(23)
        LANE(24)
        LANE(25)
        LANE(26)
        LANE(27)
        LANE(28)
        LANE(29)
        LANE(30)
        LANE(31)
#undef LANE
        if (complete) {
            agg_count.write(slot, 0);
            agg_bitmap.write(slot, 0);
            hdr.agg.contributors = bitmap;
            if (flush) {
                // Still a retransmission: an aggregator above that holds these
                // contributors flushes in turn.
                hdr.agg.flags = hdr.agg.flags | AGG_FLAG_AGGREGATED;
            } else {
                hdr.agg.flags = (hdr.agg.flags | AGG_FLAG_AGGREGATED) & ~AGG_FLAG_RETRANSMIT;
            }
            // The payload changed; a zero UDP checksum over IPv4 means "none" (RFC 768).
            hdr.udp.checksum = 0;
            standard_metadata.egress_spec = job_next_hop_port;
        } else {
            agg_count.write(slot, count);
            agg_bitmap.write(slot, bitmap);
            mark_to_drop(standard_metadata);
            exit;
        }
    }
}

#endif
