/* ==========================================================================
 * innet-agg pipeline for bmv2 (v1model): ONOS-driven forwarding with packet I/O,
 * INT-MD v2.1 with Telemetry Report v2.0, and in-network gradient aggregation.
 * This file only instantiates and orders the blocks in include/.
 * ========================================================================== */
#include <core.p4>
#include <v1model.p4>

#include "include/defines.p4"
#include "include/headers.p4"
#include "include/parser.p4"
#include "include/forwarding.p4"
#include "include/aggregation.p4"
#include "include/priority.p4"
#include "include/int.p4"
#include "include/congestion.p4"
#include "include/deparser.p4"

control IngressPipe(inout headers_t hdr, inout local_metadata_t local_metadata,
                    inout standard_metadata_t standard_metadata) {
    Forwarding() forwarding;
    Aggregation() aggregation;
    IntIngress() int_ingress;
    TrafficClass() traffic_class;

    apply {
        forwarding.apply(hdr, local_metadata, standard_metadata);
        // Aggregation after forwarding: a completed sum overrides the port towards the
        // next hop; a partial one is absorbed (dropped) here.
        if (hdr.agg.isValid()) {
            aggregation.apply(hdr, local_metadata, standard_metadata);
        }
        traffic_class.apply(hdr, local_metadata, standard_metadata);
        int_ingress.apply(hdr, local_metadata, standard_metadata);
    }
}

control EgressPipe(inout headers_t hdr, inout local_metadata_t local_metadata,
                   inout standard_metadata_t standard_metadata) {
    PacketIn() packet_io;
    IntEgress() int_egress;
    IntReport() int_report;
    CongestionFeedback() congestion;

    apply {
        packet_io.apply(hdr, standard_metadata);
        congestion.apply(hdr, local_metadata, standard_metadata);
        int_egress.apply(hdr, local_metadata, standard_metadata);
        if (standard_metadata.instance_type == PKT_INSTANCE_TYPE_INGRESS_CLONE) {
            int_report.apply(hdr, local_metadata, standard_metadata);
        }
    }
}

V1Switch(ParserImpl(), VerifyChecksumImpl(), IngressPipe(), EgressPipe(),
         ComputeChecksumImpl(), DeparserImpl()) main;
