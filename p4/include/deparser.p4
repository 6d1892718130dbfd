/* ==========================================================================
 * Checksums and deparser. The report's headers come first: the sink's clone
 * carries the monitored packet as the report's inner contents.
 * ========================================================================== */
#ifndef INNET_AGG_DEPARSER_P4
#define INNET_AGG_DEPARSER_P4

#include "headers.p4"

control VerifyChecksumImpl(inout headers_t hdr, inout local_metadata_t meta) {
    apply { }
}

control ComputeChecksumImpl(inout headers_t hdr, inout local_metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
        update_checksum(hdr.report_ipv4.isValid(),
            { hdr.report_ipv4.version, hdr.report_ipv4.ihl, hdr.report_ipv4.dscp,
              hdr.report_ipv4.ecn, hdr.report_ipv4.total_len, hdr.report_ipv4.identification,
              hdr.report_ipv4.flags, hdr.report_ipv4.frag_offset, hdr.report_ipv4.ttl,
              hdr.report_ipv4.protocol, hdr.report_ipv4.src_addr, hdr.report_ipv4.dst_addr },
            hdr.report_ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control DeparserImpl(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.report_ethernet);
        packet.emit(hdr.report_ipv4);
        packet.emit(hdr.report_udp);
        packet.emit(hdr.report_group);
        packet.emit(hdr.report_individual);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.tcp);
        packet.emit(hdr.udp);
        packet.emit(hdr.int_shim);
        packet.emit(hdr.int_md);
        // This hop first (newest on top, INT v2.1 §5.7), fields in bitmap order.
        packet.emit(hdr.int_node_id);
        packet.emit(hdr.int_l1_ports);
        packet.emit(hdr.int_hop_latency);
        packet.emit(hdr.int_q_occupancy);
        packet.emit(hdr.int_ingress_ts);
        packet.emit(hdr.int_egress_ts);
        packet.emit(hdr.int_tx_util);
        packet.emit(hdr.int_data);
        packet.emit(hdr.agg);
        packet.emit(hdr.agg_values);
    }
}

#endif
