"""Every name of the P4 program (p4/) that code or docs outside it rely on.

One place: the ONOS app contract (docs/onos-aggregation-api.md), the bmv2 tests and the
host agent use these, and tests/p4/test_p4info.py checks each against the committed P4Info,
so a rename in p4/ that is not made here fails without a compiler.
"""

from __future__ import annotations

P4INFO_PATH = "p4/build/innet_agg.p4info.txt"
BMV2_JSON_PATH = "p4/build/innet_agg.json"

CPU_PORT = 255
AGG_UDP_PORT = 48879
AGG_SLOTS = 1024
AGG_JOBS = 256
INT_DSCP = 0x17
REPORT_CLONE_SESSION = 500

# Forwarding (ONOS flow rules; same shape as ONOS's basic pipeline).
FWD_TABLE = "IngressPipe.forwarding.table0"
FWD_MATCH_FIELDS = (
    "standard_metadata.ingress_port",
    "hdr.ethernet.src_addr",
    "hdr.ethernet.dst_addr",
    "hdr.ethernet.ether_type",
    "hdr.ipv4.src_addr",
    "hdr.ipv4.dst_addr",
    "hdr.ipv4.protocol",
    "local_metadata.l4_src_port",
    "local_metadata.l4_dst_port",
)
FWD_SET_EGRESS_PORT = "IngressPipe.forwarding.set_egress_port"
FWD_SET_EGRESS_PORT_PARAMS = ("port",)
FWD_SEND_TO_CPU = "IngressPipe.forwarding.send_to_cpu"
FWD_DROP = "IngressPipe.forwarding.drop"
FWD_COUNTER = "IngressPipe.forwarding.table0_counter"

# Aggregation (the ONOS app writes one entry per job and aggregator switch).
AGG_JOB_TABLE = "IngressPipe.aggregation.agg_job"
AGG_JOB_MATCH_FIELDS = ("job_id",)
AGG_SET_JOB = "IngressPipe.aggregation.set_job"
AGG_SET_JOB_PARAMS = ("pool_base", "pool_size", "fan_in", "next_hop_port")
AGG_REGISTERS = (
    "IngressPipe.aggregation.agg_values",
    "IngressPipe.aggregation.agg_bitmap",
    "IngressPipe.aggregation.agg_count",
    "IngressPipe.aggregation.agg_seq",
    "IngressPipe.aggregation.agg_run",
)

# INT.
INT_WATCHLIST_TABLE = "IngressPipe.int_ingress.int_watchlist"
INT_WATCHLIST_MATCH_FIELDS = (
    "hdr.ipv4.src_addr",
    "hdr.ipv4.dst_addr",
    "hdr.ipv4.protocol",
    "local_metadata.l4_src_port",
    "local_metadata.l4_dst_port",
)
INT_SOURCE = "IngressPipe.int_ingress.int_source"
INT_SOURCE_PARAMS = ("remaining_hop_cnt", "instruction_bitmap")
INT_SINK_TABLE = "IngressPipe.int_ingress.int_sink"
INT_SINK_MATCH_FIELDS = ("egress_port",)
INT_SET_SINK = "IngressPipe.int_ingress.int_set_sink"
INT_SWITCH_TABLE = "EgressPipe.int_egress.int_switch"
INT_SET_SWITCH = "EgressPipe.int_egress.int_set_switch"
INT_SET_SWITCH_PARAMS = ("switch_id",)
INT_TX_UTILIZATION_REGISTER = "EgressPipe.int_egress.tx_utilization"
REPORT_TABLE = "EgressPipe.int_report.report_collector"
REPORT_SET_COLLECTOR = "EgressPipe.int_report.set_collector"
REPORT_SET_COLLECTOR_PARAMS = ("src_mac", "dst_mac", "src_ip", "collector_ip", "collector_port")

# Traffic classes (priority.p4): strict-priority egress queues.
TC_TABLE = "IngressPipe.traffic_class.traffic_class"
TC_MATCH_FIELDS = (
    "is_agg",
    "agg_job_id",
    "dscp",
    "ipv4_src",
    "ipv4_dst",
    "ip_proto",
    "l4_src_port",
    "l4_dst_port",
)
TC_SET_CLASS = "IngressPipe.traffic_class.set_class"
TC_SET_CLASS_PARAMS = ("class",)
TC_COUNTER = "IngressPipe.traffic_class.traffic_class_counter"
TC_CLASSES = 8  # v1model's 3-bit priority; simple_switch needs --priority-queues 8

# Congestion feedback (congestion.p4): the ECN marking threshold, in packets (0: off).
ECN_TABLE = "EgressPipe.congestion.ecn_marking"
ECN_SET_THRESHOLD = "EgressPipe.congestion.set_ecn_threshold"
ECN_SET_THRESHOLD_PARAMS = ("packets",)

# Packet I/O (ONOS's interpreter reads and writes these metadata).
PACKET_IN = "packet_in"
PACKET_IN_METADATA = ("ingress_port",)
PACKET_OUT = "packet_out"
PACKET_OUT_METADATA = ("egress_port",)

TABLES: dict[str, tuple[str, ...]] = {
    FWD_TABLE: FWD_MATCH_FIELDS,
    AGG_JOB_TABLE: AGG_JOB_MATCH_FIELDS,
    INT_WATCHLIST_TABLE: INT_WATCHLIST_MATCH_FIELDS,
    INT_SINK_TABLE: INT_SINK_MATCH_FIELDS,
    INT_SWITCH_TABLE: (),
    REPORT_TABLE: (),
    TC_TABLE: TC_MATCH_FIELDS,
    ECN_TABLE: (),
}
ACTIONS: dict[str, tuple[str, ...]] = {
    FWD_SET_EGRESS_PORT: FWD_SET_EGRESS_PORT_PARAMS,
    FWD_SEND_TO_CPU: (),
    FWD_DROP: (),
    AGG_SET_JOB: AGG_SET_JOB_PARAMS,
    INT_SOURCE: INT_SOURCE_PARAMS,
    INT_SET_SINK: (),
    INT_SET_SWITCH: INT_SET_SWITCH_PARAMS,
    REPORT_SET_COLLECTOR: REPORT_SET_COLLECTOR_PARAMS,
    TC_SET_CLASS: TC_SET_CLASS_PARAMS,
    ECN_SET_THRESHOLD: ECN_SET_THRESHOLD_PARAMS,
}
REGISTERS: tuple[str, ...] = (*AGG_REGISTERS, INT_TX_UTILIZATION_REGISTER)
CONTROLLER_HEADERS: dict[str, tuple[str, ...]] = {
    PACKET_IN: PACKET_IN_METADATA,
    PACKET_OUT: PACKET_OUT_METADATA,
}
