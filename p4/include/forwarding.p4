/* ==========================================================================
 * Forwarding that ONOS drives: one ternary table over standard header fields with
 * output / drop / to-controller actions, as in ONOS's basic pipeline, so the
 * pipeconf's interpreter maps flow-rule criteria and instructions one to one.
 * ========================================================================== */
#ifndef INNET_AGG_FORWARDING_P4
#define INNET_AGG_FORWARDING_P4

#include "headers.p4"

control Forwarding(inout headers_t hdr, inout local_metadata_t local_metadata,
                   inout standard_metadata_t standard_metadata) {

    direct_counter(CounterType.packets_and_bytes) table0_counter;

    action set_egress_port(port_t port) {
        standard_metadata.egress_spec = port;
        table0_counter.count();
    }

    action send_to_cpu() {
        standard_metadata.egress_spec = CPU_PORT;
        table0_counter.count();
    }

    action drop() {
        mark_to_drop(standard_metadata);
        table0_counter.count();
    }

    table table0 {
        key = {
            standard_metadata.ingress_port : ternary;
            hdr.ethernet.src_addr          : ternary;
            hdr.ethernet.dst_addr          : ternary;
            hdr.ethernet.ether_type        : ternary;
            hdr.ipv4.src_addr              : ternary;
            hdr.ipv4.dst_addr              : ternary;
            hdr.ipv4.protocol              : ternary;
            local_metadata.l4_src_port     : ternary;
            local_metadata.l4_dst_port     : ternary;
        }
        actions = { set_egress_port; send_to_cpu; drop; }
        // No matching rule means no path: drop, as ONOS's basic pipeline does.
        const default_action = drop();
        counters = table0_counter;
        size = 1024;
    }

    apply {
        if (hdr.packet_out.isValid()) {
            // ONOS chose the port (LLDP/BDDP probes, ARP replies): no lookup.
            standard_metadata.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            exit;
        }
        table0.apply();
    }
}

// Packet-in: tell ONOS where the packet came from.
control PacketIn(inout headers_t hdr, inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = standard_metadata.ingress_port;
            hdr.packet_in._pad = 0;
            exit;
        }
    }
}

#endif
