/* ==========================================================================
 * Parser: controller header, Ethernet, IPv4, TCP/UDP, INT-MD over UDP (marked by
 * DSCP), the aggregation header (by UDP destination port).
 * ========================================================================== */
#ifndef INNET_AGG_PARSER_P4
#define INNET_AGG_PARSER_P4

#include "headers.p4"

parser ParserImpl(packet_in packet, out headers_t hdr, inout local_metadata_t local_metadata,
                  inout standard_metadata_t standard_metadata) {

    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETH_TYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            IP_PROTO_TCP: parse_tcp;
            IP_PROTO_UDP: parse_udp;
            default: accept;
        }
    }

    state parse_tcp {
        packet.extract(hdr.tcp);
        local_metadata.l4_src_port = hdr.tcp.src_port;
        local_metadata.l4_dst_port = hdr.tcp.dst_port;
        transition accept;
    }

    state parse_udp {
        packet.extract(hdr.udp);
        local_metadata.l4_src_port = hdr.udp.src_port;
        local_metadata.l4_dst_port = hdr.udp.dst_port;
        transition select(hdr.ipv4.dscp, hdr.udp.dst_port) {
            (INT_DSCP, _): parse_int;
            (_, AGG_UDP_PORT): parse_agg;
            default: accept;
        }
    }

    state parse_int {
        packet.extract(hdr.int_shim);
        packet.extract(hdr.int_md);
        // The upstream hops' stack as one block: the sink removes it by invalidating it.
        packet.extract(hdr.int_data,
                       (bit<32>)((hdr.int_shim.len - INT_MD_HEADER_WORDS) ++ 5w0));
        transition select(hdr.udp.dst_port) {
            AGG_UDP_PORT: parse_agg;
            default: accept;
        }
    }

    state parse_agg {
        packet.extract(hdr.agg);
        local_metadata.agg_lanes_left = AGG_LANES;
        transition parse_agg_value;
    }

    // A counter, not `lastIndex`: bmv2 cannot select on a header stack's last index.
    state parse_agg_value {
        packet.extract(hdr.agg_values.next);
        local_metadata.agg_lanes_left = local_metadata.agg_lanes_left - 1;
        transition select(local_metadata.agg_lanes_left) {
            0: accept;
            default: parse_agg_value;
        }
    }
}

#endif
