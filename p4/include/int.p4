/* ==========================================================================
 * INT-MD v2.1 over UDP, marked by DSCP (INT v2.1 §4.6), and Telemetry Report v2.0.
 *
 * Roles per packet (one switch may have all three):
 *   source  - int_watchlist (ingress) selects the flow; egress inserts shim + metadata
 *             header after UDP and sets DSCP INT_DSCP (the original DSCP goes in the shim);
 *   transit - every switch, source included, pushes its hop metadata (egress);
 *   sink    - int_sink (ingress, by egress port: the port faces a host) clones the packet
 *             to REPORT_CLONE_SESSION; the original leaves with INT stripped and DSCP and
 *             lengths restored; the clone pushes this hop too and becomes the report.
 *
 * The clone is taken in ingress (I2E) on purpose: bmv2 re-parses the packet as received,
 * so the stack is intact, whereas an egress clone would copy the stripped original.
 *
 * Instruction bits supported: 0 node ID, 1 level-1 ports, 2 hop latency, 3 queue ID and
 * occupancy, 4 ingress timestamp, 5 egress timestamp, 7 tx utilisation. Bits 6, 8 and the
 * reserved ones are cleared by the source, so no hop ever announces data it lacks.
 * ========================================================================== */
#ifndef INNET_AGG_INT_P4
#define INNET_AGG_INT_P4

#include "headers.p4"

control IntIngress(inout headers_t hdr, inout local_metadata_t local_metadata,
                   inout standard_metadata_t standard_metadata) {

    // Hop ML follows from the bitmap (timestamps take two words), so the control plane
    // cannot announce a per-hop length that differs from what the hops push.
    action int_source(bit<8> remaining_hop_cnt, bit<16> instruction_bitmap) {
        bit<16> b = instruction_bitmap & INT_FULL_BITMAP_SUPPORTED;
        local_metadata.int_source = 1;
        local_metadata.int_remaining_hop_cnt = remaining_hop_cnt;
        local_metadata.int_instruction_bitmap = b;
        local_metadata.int_hop_ml = (bit<5>)(b >> 15) + (bit<5>)((b >> 14) & 1)
            + (bit<5>)((b >> 13) & 1) + (bit<5>)((b >> 12) & 1)
            + (((bit<5>)((b >> 11) & 1)) << 1) + (((bit<5>)((b >> 10) & 1)) << 1)
            + (bit<5>)((b >> 8) & 1);
    }

    // The watchlist: which flows get INT at this switch (the source).
    table int_watchlist {
        key = {
            hdr.ipv4.src_addr          : ternary;
            hdr.ipv4.dst_addr          : ternary;
            hdr.ipv4.protocol          : ternary;
            local_metadata.l4_src_port : ternary;
            local_metadata.l4_dst_port : ternary;
        }
        actions = { int_source; @defaultonly NoAction; }
        const default_action = NoAction();
        size = 128;
    }

    action int_set_sink() {
        local_metadata.int_sink = 1;
    }

    table int_sink {
        key = { standard_metadata.egress_spec : exact @name("egress_port"); }
        actions = { int_set_sink; @defaultonly NoAction; }
        const default_action = NoAction();
        size = 64;
    }

    apply {
        if (!hdr.udp.isValid() || standard_metadata.egress_spec == CPU_PORT) {
            return;
        }
        if (!hdr.int_shim.isValid()) {
            int_watchlist.apply();
        }
        if (hdr.int_shim.isValid() || local_metadata.int_source == 1) {
            int_sink.apply();
            if (local_metadata.int_sink == 1) {
                local_metadata.int_ingress_port = standard_metadata.ingress_port;
                local_metadata.int_egress_port = standard_metadata.egress_spec;
                local_metadata.int_ingress_ts = standard_metadata.ingress_global_timestamp;
                clone_preserving_field_list(CloneType.I2E, REPORT_CLONE_SESSION,
                                            REPORT_CLONE_FIELDS);
            }
        }
    }
}

control IntEgress(inout headers_t hdr, inout local_metadata_t local_metadata,
                  inout standard_metadata_t standard_metadata) {

    // bmv2 has no tx utilisation: bytes sent per 1024 us window, smoothed (EWMA 1/4).
    register<bit<48>>(PORTS) tx_window_start;
    register<bit<32>>(PORTS) tx_window_bytes;
    register<bit<32>>(PORTS) tx_utilization;

    action int_set_switch(bit<32> switch_id) {
        local_metadata.switch_id = switch_id;
    }

    // Keyless: the control plane sets this switch's INT node ID as the default action.
    table int_switch {
        key = {}
        actions = { int_set_switch; }
        default_action = int_set_switch(0);
    }

    action insert_int() {
        hdr.int_shim.setValid();
        hdr.int_shim.int_type = INT_SHIM_TYPE_MD;
        hdr.int_shim.npt = 0;  // DSCP marking: the last byte keeps the original DSCP
        hdr.int_shim.rsvd = 0;
        hdr.int_shim.len = INT_MD_HEADER_WORDS;
        hdr.int_shim.rsvd2 = 0;
        hdr.int_shim.orig_dscp = hdr.ipv4.dscp;
        hdr.int_shim.rsvd3 = 0;
        hdr.int_md.setValid();
        hdr.int_md.ver = INT_VERSION;
        hdr.int_md.d = 0;
        hdr.int_md.e = 0;
        hdr.int_md.m = 0;
        hdr.int_md.rsvd = 0;
        hdr.int_md.hop_ml = local_metadata.int_hop_ml;
        hdr.int_md.remaining_hop_cnt = local_metadata.int_remaining_hop_cnt;
        hdr.int_md.instruction_bitmap = local_metadata.int_instruction_bitmap;
        hdr.int_md.domain_id = 0;
        hdr.int_md.ds_instruction = 0;
        hdr.int_md.ds_flags = 0;
        hdr.ipv4.dscp = INT_DSCP;
        hdr.ipv4.total_len = hdr.ipv4.total_len + 16;
        hdr.udp.len = hdr.udp.len + 16;
        hdr.udp.checksum = 0;
    }

    action strip_int() {
        bit<16> int_bytes = ((bit<16>)hdr.int_shim.len + 1) << 2;
        hdr.ipv4.dscp = hdr.int_shim.orig_dscp;
        hdr.ipv4.total_len = hdr.ipv4.total_len - int_bytes;
        hdr.udp.len = hdr.udp.len - int_bytes;
        hdr.udp.checksum = 0;
        hdr.int_shim.setInvalid();
        hdr.int_md.setInvalid();
        hdr.int_data.setInvalid();
    }

    apply {
        int_switch.apply();
        if (standard_metadata.instance_type == PKT_INSTANCE_TYPE_NORMAL
                && local_metadata.int_sink == 1) {
            if (hdr.int_shim.isValid()) {
                strip_int();
            }
            return;
        }
        if (local_metadata.int_source == 1 && !hdr.int_shim.isValid()) {
            insert_int();
        }
        if (!hdr.int_shim.isValid() || !hdr.int_md.isValid()) {
            return;
        }
        if (hdr.int_md.remaining_hop_cnt == 0) {
            hdr.int_md.e = 1;  // max hop count exceeded: forward without pushing
            return;
        }
        port_t in_port = standard_metadata.ingress_port;
        port_t eg_port = standard_metadata.egress_port;
        bit<48> in_ts = standard_metadata.ingress_global_timestamp;
        if (standard_metadata.instance_type == PKT_INSTANCE_TYPE_INGRESS_CLONE) {
            in_port = local_metadata.int_ingress_port;  // the report's hop is the original's
            eg_port = local_metadata.int_egress_port;
            in_ts = local_metadata.int_ingress_ts;
        }
        bit<16> bitmap = hdr.int_md.instruction_bitmap;
        bit<48> now = standard_metadata.egress_global_timestamp;

        bit<48> start;
        bit<32> bytes;
        bit<32> util;
        tx_window_start.read(start, (bit<32>)eg_port);
        tx_window_bytes.read(bytes, (bit<32>)eg_port);
        tx_utilization.read(util, (bit<32>)eg_port);
        if (standard_metadata.instance_type == PKT_INSTANCE_TYPE_NORMAL) {
            bytes = bytes + standard_metadata.packet_length;
        }
        if (now - start >= TX_WINDOW_US) {
            util = util - (util >> 2) + (bytes >> 2);
            tx_utilization.write((bit<32>)eg_port, util);
            tx_window_start.write((bit<32>)eg_port, now);
            bytes = 0;
        }
        tx_window_bytes.write((bit<32>)eg_port, bytes);

        if (bitmap & 0x8000 != 0) {
            hdr.int_node_id.setValid();
            hdr.int_node_id.node_id = local_metadata.switch_id;
        }
        if (bitmap & 0x4000 != 0) {
            hdr.int_l1_ports.setValid();
            hdr.int_l1_ports.ingress_port = (bit<16>)in_port;
            hdr.int_l1_ports.egress_port = (bit<16>)eg_port;
        }
        if (bitmap & 0x2000 != 0) {
            hdr.int_hop_latency.setValid();
            hdr.int_hop_latency.hop_latency =
                (bit<32>)(now - in_ts) * NS_PER_US;
        }
        if (bitmap & 0x1000 != 0) {
            hdr.int_q_occupancy.setValid();
            // The packet's queue is its traffic class (priority.p4); bmv2 gives the
            // occupancy of that queue.
            hdr.int_q_occupancy.q_id = (bit<8>)standard_metadata.priority;
            hdr.int_q_occupancy.q_occupancy = (bit<24>)standard_metadata.enq_qdepth;
        }
        if (bitmap & 0x0800 != 0) {
            hdr.int_ingress_ts.setValid();
            hdr.int_ingress_ts.ingress_ts =
                (bit<64>)in_ts * (bit<64>)NS_PER_US;
        }
        if (bitmap & 0x0400 != 0) {
            hdr.int_egress_ts.setValid();
            hdr.int_egress_ts.egress_ts = (bit<64>)now * (bit<64>)NS_PER_US;
        }
        if (bitmap & 0x0100 != 0) {
            hdr.int_tx_util.setValid();
            hdr.int_tx_util.tx_util = util;
        }
        hdr.int_md.remaining_hop_cnt = hdr.int_md.remaining_hop_cnt - 1;
        hdr.int_shim.len = hdr.int_shim.len + (bit<8>)hdr.int_md.hop_ml;
        bit<16> hop_bytes = (bit<16>)hdr.int_md.hop_ml << 2;
        hdr.ipv4.total_len = hdr.ipv4.total_len + hop_bytes;
        hdr.udp.len = hdr.udp.len + hop_bytes;
        hdr.udp.checksum = 0;
    }
}

// The sink's clone becomes a Telemetry Report v2.0 to the collector (docs/protocols.md).
control IntReport(inout headers_t hdr, inout local_metadata_t local_metadata,
                  inout standard_metadata_t standard_metadata) {

    register<bit<32>>(1) report_seq;

    action set_collector(mac_t src_mac, mac_t dst_mac, ipv4_addr_t src_ip,
                         ipv4_addr_t collector_ip, bit<16> collector_port) {
        hdr.report_ethernet.setValid();
        hdr.report_ethernet.src_addr = src_mac;
        hdr.report_ethernet.dst_addr = dst_mac;
        hdr.report_ethernet.ether_type = ETH_TYPE_IPV4;
        hdr.report_ipv4.setValid();
        hdr.report_ipv4.version = 4;
        hdr.report_ipv4.ihl = 5;
        hdr.report_ipv4.dscp = 0;
        hdr.report_ipv4.ecn = 0;
        hdr.report_ipv4.identification = 0;
        hdr.report_ipv4.flags = 0b010;  // don't fragment
        hdr.report_ipv4.frag_offset = 0;
        hdr.report_ipv4.ttl = 64;
        hdr.report_ipv4.protocol = IP_PROTO_UDP;
        hdr.report_ipv4.src_addr = src_ip;
        hdr.report_ipv4.dst_addr = collector_ip;
        hdr.report_udp.setValid();
        hdr.report_udp.src_port = collector_port;
        hdr.report_udp.dst_port = collector_port;
        hdr.report_udp.checksum = 0;
    }

    // Keyless: the collector's address is the default action the control plane sets.
    table report_collector {
        key = {}
        actions = { set_collector; @defaultonly NoAction; }
        default_action = NoAction();
    }

    apply {
        if (hdr.int_md.isValid()) {
            report_collector.apply();
        }
        // A keyless table's default action is a miss: its effect tells it was configured.
        if (!hdr.report_udp.isValid()) {
            mark_to_drop(standard_metadata);
            return;
        }
        bit<32> seq;
        report_seq.read(seq, 0);
        report_seq.write(0, seq + 1);
        hdr.report_group.setValid();
        hdr.report_group.ver = 2;
        hdr.report_group.hw_id = 0;
        hdr.report_group.seq_no = seq[21:0];
        hdr.report_group.node_id = local_metadata.switch_id;
        hdr.report_individual.setValid();
        hdr.report_individual.rep_type = REPORT_REP_TYPE_INT;
        hdr.report_individual.in_type = REPORT_IN_TYPE_ETHERNET;
        hdr.report_individual.rep_len = REPORT_LENGTH_TO_END;
        hdr.report_individual.md_len = 0;  // the sink's own metadata is the stack's top hop
        hdr.report_individual.d = 0;
        hdr.report_individual.q = 0;
        hdr.report_individual.f = 1;       // tracked flow: it was on the watchlist
        hdr.report_individual.i = 0;
        hdr.report_individual.rsvd = 0;
        hdr.report_individual.rep_md_bits = 0;
        hdr.report_individual.domain_id = hdr.int_md.domain_id;
        hdr.report_individual.ds_md_bits = 0;
        hdr.report_individual.ds_md_status = 0;
        // 8 B group + 12 B individual report + the packet from its Ethernet header on.
        bit<16> inner = hdr.ipv4.total_len + 14;
        hdr.report_udp.len = 8 + 20 + inner;
        hdr.report_ipv4.total_len = 20 + 8 + 20 + inner;
    }
}

#endif
