/* ==========================================================================
 * Constants and sizes, in one place (docs/protocols.md names each of them).
 * ========================================================================== */
#ifndef INNET_AGG_DEFINES_P4
#define INNET_AGG_DEFINES_P4

typedef bit<9>  port_t;
typedef bit<48> mac_t;
typedef bit<32> ipv4_addr_t;

const port_t CPU_PORT = 255;          // simple_switch_grpc --cpu-port 255, as ONOS expects

const bit<16> ETH_TYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_TCP  = 6;
const bit<8>  IP_PROTO_UDP  = 17;

/* Aggregation protocol ---------------------------------------------------- */
const bit<16> AGG_UDP_PORT = 48879;   // 0xBEEF: destination port of every aggregation packet
// 32 int32 lanes = 128 B of payload: every lane costs one register read and write per packet
// on bmv2, so a wider vector slows the software switch down more than it saves in headers;
// on hardware the same layout maps to one register per lane per stage.
#define AGG_LANES 32
// UDP length of an aggregation packet of AGG_LANES values without INT (8 + 20 + 4 * 32):
// only such packets are summed. A job whose parameter server makes every sum may send
// chunks of 32 * k values (docs/protocols.md, "Chunk size"); they are forwarded unsummed.
const bit<16> AGG_UDP_LEN = 156;
const bit<32> AGG_SLOTS = 1024;       // slots per switch, shared by every job's pool
const bit<32> AGG_LANE_CELLS = 32768; // AGG_SLOTS * AGG_LANES: one register cell per lane per slot
const bit<32> AGG_JOBS = 256;         // jobs configurable per switch
const bit<8>  AGG_FLAG_AGGREGATED = 0x01;
const bit<8>  AGG_FLAG_RETRANSMIT = 0x02;
const bit<8>  AGG_FLAG_ACK        = 0x04;
// In an acknowledgement: the chunk (or a packet of it) arrived marked CE (congestion.p4).
const bit<8>  AGG_FLAG_ECN_ECHO   = 0x08;
// A worker asks the parameter server for its run (the answer also has ACK): passes unchanged.
const bit<8>  AGG_FLAG_JOIN       = 0x10;

/* Traffic classes (priority.p4) -------------------------------------------- */
const bit<32> TRAFFIC_CLASS_ENTRIES = 512;

/* INT-MD v2.1 over UDP, marked by DSCP (INT v2.1 §4.6) -------------------- */
const bit<6>  INT_DSCP = 0x17;        // the spec's example value; int-collector's default
const bit<4>  INT_VERSION = 2;
const bit<4>  INT_SHIM_TYPE_MD = 1;
const bit<8>  INT_MD_HEADER_WORDS = 3;
// Largest stack carried through a switch: 8 hops of the 9 words our bitmap can ask for.
#define INT_MAX_STACK_BITS 2304
const bit<16> INT_FULL_BITMAP_SUPPORTED = 0xFD00;  // bits 0-5 and 7 (see int.p4)

/* Telemetry Report v2.0 ----------------------------------------------------- */
const bit<32> REPORT_CLONE_SESSION = 500;  // mirror session to the collector's port
const bit<8>  REPORT_CLONE_FIELDS = 1;     // @field_list index preserved into the clone
const bit<8>  REPORT_LENGTH_TO_END = 0xFF; // int-collector: the report runs to the datagram's end
const bit<4>  REPORT_IN_TYPE_ETHERNET = 3;
const bit<4>  REPORT_REP_TYPE_INT = 1;

// bmv2 timestamps count microseconds; INT fields carry nanoseconds (collector v2_time_unit_ns 1).
const bit<32> NS_PER_US = 1000;
// tx utilisation: bytes sent per window of 1024 us, smoothed by an EWMA of weight 1/4.
const bit<48> TX_WINDOW_US = 1024;
const bit<32> PORTS = 512;

// v1model instance_type values (bmv2 simple_switch docs).
const bit<32> PKT_INSTANCE_TYPE_NORMAL = 0;
const bit<32> PKT_INSTANCE_TYPE_INGRESS_CLONE = 1;

#endif
