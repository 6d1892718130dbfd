/* ==========================================================================
 * Headers and metadata.
 * ========================================================================== */
#ifndef INNET_AGG_HEADERS_P4
#define INNET_AGG_HEADERS_P4

#include "defines.p4"

/* Controller headers: ONOS's P4Runtime packet I/O (link discovery LLDP/BDDP, ARP). */
@controller_header("packet_in")
header packet_in_t {
    port_t  ingress_port;
    bit<7>  _pad;
}

@controller_header("packet_out")
header packet_out_t {
    port_t  egress_port;
    bit<7>  _pad;
}

header ethernet_t {
    mac_t   dst_addr;
    mac_t   src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<6>  dscp;
    bit<2>  ecn;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header tcp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<32> seq_no;
    bit<32> ack_no;
    bit<4>  data_offset;
    bit<4>  res;
    bit<8>  flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent_ptr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> len;
    bit<16> checksum;
}

/* Aggregation protocol (docs/protocols.md, "Aggregation protocol"): 20 B + 32 x 4 B. */
header agg_t {
    bit<16> job_id;
    bit<16> slot;          // index within the job's pool at every aggregator
    bit<8>  worker_id;     // sender's worker index (0-31); informative for the switch
    bit<8>  fan_in;        // workers in the job: the parameter server's expected total
    bit<8>  flags;         // AGG_FLAG_*
    bit<8>  max_queue;     // longest egress queue met (packets, <= 255; congestion.p4);
                           // an acknowledgement echoes the value its chunk arrived with
    bit<32> contributors;  // bitmap of the workers whose values the vector holds
    bit<32> seq;           // chunk sequence number of the sender's stream
    bit<32> run;           // the job's run (its parameter server's): a slot never adds a
                           // packet to another run's chunk (docs/protocols.md, "Runs")
}

header agg_value_t {
    bit<32> v;             // int32, two's complement; sums wrap, hosts prevent overflow
}

/* INT-MD v2.1 (INT v2.1 §5.7). */
header int_shim_t {
    bit<4>  int_type;
    bit<2>  npt;
    bit<2>  rsvd;
    bit<8>  len;           // words of metadata header + stack; the shim is not counted
    bit<8>  rsvd2;
    bit<6>  orig_dscp;     // NPT 0: the DSCP the source replaced
    bit<2>  rsvd3;
}

header int_md_t {
    bit<4>  ver;
    bit<1>  d;
    bit<1>  e;
    bit<1>  m;
    bit<12> rsvd;
    bit<5>  hop_ml;
    bit<8>  remaining_hop_cnt;
    bit<16> instruction_bitmap;
    bit<16> domain_id;
    bit<16> ds_instruction;
    bit<16> ds_flags;
}

// This hop's metadata, one header per instruction bit, emitted in bitmap order.
header int_node_id_t      { bit<32> node_id; }
header int_l1_ports_t     { bit<16> ingress_port; bit<16> egress_port; }
header int_hop_latency_t  { bit<32> hop_latency; }
header int_q_occupancy_t  { bit<8> q_id; bit<24> q_occupancy; }
header int_ingress_ts_t   { bit<64> ingress_ts; }
header int_egress_ts_t    { bit<64> egress_ts; }
header int_tx_util_t      { bit<32> tx_util; }

// The hops pushed upstream, carried as one opaque block so the sink can strip it.
header int_data_t { varbit<INT_MAX_STACK_BITS> data; }

/* Telemetry Report v2.0 (Telemetry Report v2.0 §3), with INT report main contents. */
header report_group_t {
    bit<4>  ver;
    bit<6>  hw_id;
    bit<22> seq_no;
    bit<32> node_id;
}

header report_individual_t {
    bit<4>  rep_type;
    bit<4>  in_type;
    bit<8>  rep_len;
    bit<8>  md_len;
    bit<1>  d;
    bit<1>  q;
    bit<1>  f;
    bit<1>  i;
    bit<4>  rsvd;
    bit<16> rep_md_bits;
    bit<16> domain_id;
    bit<16> ds_md_bits;
    bit<16> ds_md_status;
}

struct headers_t {
    packet_out_t        packet_out;
    packet_in_t         packet_in;
    ethernet_t          report_ethernet;
    ipv4_t              report_ipv4;
    udp_t               report_udp;
    report_group_t      report_group;
    report_individual_t report_individual;
    ethernet_t          ethernet;
    ipv4_t              ipv4;
    tcp_t               tcp;
    udp_t               udp;
    int_shim_t          int_shim;
    int_md_t            int_md;
    int_node_id_t       int_node_id;
    int_l1_ports_t      int_l1_ports;
    int_hop_latency_t   int_hop_latency;
    int_q_occupancy_t   int_q_occupancy;
    int_ingress_ts_t    int_ingress_ts;
    int_egress_ts_t     int_egress_ts;
    int_tx_util_t       int_tx_util;
    int_data_t          int_data;
    agg_t               agg;
    agg_value_t[AGG_LANES] agg_values;
}

struct local_metadata_t {
    // Names as in ONOS's basic pipeline, whose interpreter maps flow-rule criteria to them.
    bit<16> l4_src_port;
    bit<16> l4_dst_port;
    // INT: decided in ingress, acted on in egress. The clone that becomes the report keeps
    // these (field list REPORT_CLONE_FIELDS): bmv2 resets other metadata of a clone.
    @field_list(1) bit<1>  int_source;
    @field_list(1) bit<5>  int_hop_ml;
    @field_list(1) bit<8>  int_remaining_hop_cnt;
    @field_list(1) bit<16> int_instruction_bitmap;
    @field_list(1) port_t  int_ingress_port;  // the original's ports, for the sink's hop:
    @field_list(1) port_t  int_egress_port;   // a clone's own are 0 and the mirror port,
    @field_list(1) bit<48> int_ingress_ts;    // and its ingress timestamp is 0
    bit<1>  int_sink;
    bit<32> switch_id;
    bit<8>  agg_lanes_left;  // parser loop counter
    // Traffic classes (priority.p4): the aggregation header's job, 0 without one.
    bit<1>  is_agg;
    bit<16> agg_job_id;
}

#endif
