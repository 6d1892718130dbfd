/* ==========================================================================
 * Traffic classes: the strict-priority egress queue a packet waits in (docs/scheduling.md,
 * "On switches").
 *
 * One ternary table maps a flow to a class 0-7: by the aggregation header's job id (a
 * job's streams and its sums), by DSCP (what hosts tag, JPAS-style), or by the usual
 * 5-tuple fields. No match leaves class 0, the default for everything else. The class
 * is v1model's `priority`: simple_switch serves an egress port's queues from the highest
 * class down, and runs with as many queues per port as `--priority-queues` says (bmv2
 * drops a packet whose class has no queue: start it with `-- --priority-queues 8`).
 * INT reports the class as the hop's queue id, and the occupancy is that queue's.
 * ========================================================================== */
#ifndef INNET_AGG_PRIORITY_P4
#define INNET_AGG_PRIORITY_P4

#include "headers.p4"

control TrafficClass(inout headers_t hdr, inout local_metadata_t local_metadata,
                     inout standard_metadata_t standard_metadata) {

    direct_counter(CounterType.packets_and_bytes) traffic_class_counter;

    action set_class(bit<3> class) {
        standard_metadata.priority = class;
        traffic_class_counter.count();
    }

    table traffic_class {
        key = {
            local_metadata.is_agg      : ternary @name("is_agg");
            local_metadata.agg_job_id  : ternary @name("agg_job_id");
            hdr.ipv4.dscp              : ternary @name("dscp");
            hdr.ipv4.src_addr          : ternary @name("ipv4_src");
            hdr.ipv4.dst_addr          : ternary @name("ipv4_dst");
            hdr.ipv4.protocol          : ternary @name("ip_proto");
            local_metadata.l4_src_port : ternary @name("l4_src_port");
            local_metadata.l4_dst_port : ternary @name("l4_dst_port");
        }
        actions = { set_class; @defaultonly NoAction; }
        const default_action = NoAction();
        counters = traffic_class_counter;
        size = TRAFFIC_CLASS_ENTRIES;
    }

    apply {
        if (hdr.agg.isValid()) {
            local_metadata.is_agg = 1;
            local_metadata.agg_job_id = hdr.agg.job_id;
        }
        traffic_class.apply();
    }
}

#endif
