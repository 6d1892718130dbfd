package org.innetagg.onos.pipeconf;

import org.innetagg.onos.aggregation.AggregationManager;
import org.innetagg.onos.telemetry.IntSwitchIdService;
import org.onlab.packet.EthType;
import org.onlab.packet.IPv4;
import org.onlab.packet.IpAddress;
import org.onlab.packet.IpPrefix;
import org.onlab.packet.MacAddress;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.net.ConnectPoint;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.Host;
import org.onosproject.net.Path;
import org.onosproject.net.PortNumber;
import org.onosproject.net.behaviour.inbandtelemetry.IntDeviceConfig;
import org.onosproject.net.behaviour.inbandtelemetry.IntMetadataType;
import org.onosproject.net.behaviour.inbandtelemetry.IntObjective;
import org.onosproject.net.behaviour.inbandtelemetry.IntProgrammable;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.driver.AbstractHandlerBehaviour;
import org.onosproject.net.flow.DefaultFlowRule;
import org.onosproject.net.flow.DefaultTrafficSelector;
import org.onosproject.net.flow.DefaultTrafficTreatment;
import org.onosproject.net.flow.FlowEntry;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.flow.TableId;
import org.onosproject.net.flow.criteria.Criterion;
import org.onosproject.net.flow.criteria.EthTypeCriterion;
import org.onosproject.net.flow.criteria.IPCriterion;
import org.onosproject.net.flow.criteria.IPProtocolCriterion;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.flow.criteria.UdpPortCriterion;
import org.onosproject.net.group.DefaultGroupBucket;
import org.onosproject.net.group.DefaultGroupDescription;
import org.onosproject.net.group.DefaultGroupKey;
import org.onosproject.net.group.Group;
import org.onosproject.net.group.GroupBuckets;
import org.onosproject.net.group.GroupDescription;
import org.onosproject.net.group.GroupKey;
import org.onosproject.net.group.GroupService;
import org.onosproject.net.host.HostService;
import org.onosproject.net.pi.model.PiTableId;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;
import org.onosproject.net.topology.PathService;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.nio.charset.StandardCharsets;
import java.util.Comparator;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.StreamSupport;

import static org.innetagg.onos.pipeconf.P4InfoConstants.COLLECTOR_IP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.COLLECTOR_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.DST_MAC;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_EGRESS_INT_SET_SWITCH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_EGRESS_INT_SWITCH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_REPORT_SET_COLLECTOR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PORT_BITWIDTH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_DST_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_PROTOCOL;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_SRC_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SET_SINK;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SINK;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SOURCE;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INSTRUCTION_BITMAP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INT_FULL_BITMAP_SUPPORTED;
import static org.innetagg.onos.pipeconf.P4InfoConstants.LOCAL_METADATA_L4_DST_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.LOCAL_METADATA_L4_SRC_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.REMAINING_HOP_CNT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.REPORT_CLONE_SESSION;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SRC_IP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SRC_MAC;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SWITCH_ID;

/**
 * INT for ONOS's own INT app ({@code org.onosproject.inbandtelemetry}): it calls this
 * behaviour on every device of our pipeconf, with the watchlist and collector it is given
 * in its GUI or REST API. The mapping onto the pipeline (p4/include/int.p4):
 *
 * <ul>
 * <li>{@link #init()}: {@code int_switch}'s default action, the device's INT node ID
 *     ({@link IntSwitchIdService}); every switch then pushes its hop (transit);</li>
 * <li>{@link #addIntObjective}: one {@code int_watchlist} entry, {@code int_source} with
 *     the instruction bitmap of the objective's metadata types (source);</li>
 * <li>{@link #setSinkPort}: one {@code int_sink} entry for that egress port (sink);</li>
 * <li>{@link #setupIntConfig}: {@code report_collector}'s default action (report
 *     addresses) and clone session 500, a CLONE group whose one bucket outputs towards the
 *     collector.</li>
 * </ul>
 *
 * <p>The pipeline takes a flow as source at whichever switch first sees it without INT, by
 * the watchlist alone, so {@link #setSourcePort} has nothing to write. INT rides on UDP only:
 * objectives on TCP ports or another IP protocol are refused. ONOS 2.7 names INT 1.0's
 * metadata types; bits 0-7 of the INT 1.0 and INT-MD 2.1 instruction bitmaps mean the same,
 * so the mapping is one to one. Node ID and level-1 ports are always requested: the collector
 * attributes a hop to a link by them. Level-2 ports (bit 6) the pipeline does not emit.
 */
public class IntProgrammableImpl extends AbstractHandlerBehaviour implements IntProgrammable {

    /** INT-MD's remaining hop count at the source: more than a fat-tree's 5 switches. */
    static final int MAX_HOPS = 16;
    /** How long cleanup() waits for the report group's removal to complete. */
    static final long CLEANUP_WAIT_MS = 10_000;
    /** Device annotation naming the port reports leave by, when the collector is no known host. */
    public static final String REPORT_PORT_ANNOTATION = "intReportPort";
    static final GroupKey REPORT_GROUP_KEY =
            new DefaultGroupKey("innet-agg-int-report".getBytes(StandardCharsets.UTF_8));

    static final Set<PiTableId> INT_TABLES = Set.of(
            INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST, INGRESS_PIPE_INT_INGRESS_INT_SINK,
            EGRESS_PIPE_INT_EGRESS_INT_SWITCH, EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR);

    /** INT instruction bitmap bit of each metadata type (bit 0 is the MSB of 16). */
    static final Map<IntMetadataType, Integer> BITS = new EnumMap<>(Map.of(
            IntMetadataType.SWITCH_ID, 0x8000,
            IntMetadataType.L1_PORT_ID, 0x4000,
            IntMetadataType.HOP_LATENCY, 0x2000,
            IntMetadataType.QUEUE_OCCUPANCY, 0x1000,
            IntMetadataType.INGRESS_TIMESTAMP, 0x0800,
            IntMetadataType.EGRESS_TIMESTAMP, 0x0400,
            IntMetadataType.L2_PORT_ID, 0x0200,
            IntMetadataType.EGRESS_TX_UTIL, 0x0100));
    static final int ALWAYS = 0x8000 | 0x4000;

    private final Logger log = LoggerFactory.getLogger(getClass());

    private DeviceId deviceId() {
        return data().deviceId();
    }

    private ApplicationId appId() {
        ApplicationId id = handler().get(CoreService.class).getAppId(AggregationManager.APP_NAME);
        if (id == null) {
            throw new IllegalStateException(AggregationManager.APP_NAME + " is not registered");
        }
        return id;
    }

    @Override
    public boolean init() {
        try {
            int id = handler().get(IntSwitchIdService.class).switchId(deviceId());
            apply(defaultEntry(EGRESS_PIPE_INT_EGRESS_INT_SWITCH, PiAction.builder()
                    .withId(EGRESS_PIPE_INT_EGRESS_INT_SET_SWITCH)
                    .withParameter(new PiActionParam(SWITCH_ID, id))
                    .build()));
            return true;
        } catch (RuntimeException e) {
            log.warn("{}: INT init failed: {}", deviceId(), e.getMessage());
            return false;
        }
    }

    @Override
    public boolean setSourcePort(PortNumber port) {
        // The source role is per flow (int_watchlist), whatever the ingress port.
        return port != null && !port.isLogical();
    }

    @Override
    public boolean setSinkPort(PortNumber port) {
        if (port == null || port.isLogical() || port.toLong() >= 1L << EGRESS_PORT_BITWIDTH) {
            log.warn("{}: INT sink port {} is not a port of this pipeline", deviceId(), port);
            return false;
        }
        try {
            apply(entry(INGRESS_PIPE_INT_INGRESS_INT_SINK,
                    PiCriterion.builder().matchExact(EGRESS_PORT, port.toLong()).build(), 0,
                    PiAction.builder().withId(INGRESS_PIPE_INT_INGRESS_INT_SET_SINK).build()));
            return true;
        } catch (RuntimeException e) {
            log.warn("{}: INT sink port {} failed: {}", deviceId(), port, e.getMessage());
            return false;
        }
    }

    @Override
    public boolean addIntObjective(IntObjective obj) {
        return watchlist(obj, true);
    }

    @Override
    public boolean removeIntObjective(IntObjective obj) {
        return watchlist(obj, false);
    }

    private boolean watchlist(IntObjective obj, boolean add) {
        FlowRule rule;
        try {
            rule = watchlistEntry(obj);
        } catch (IllegalArgumentException e) {
            log.warn("{}: INT objective refused: {}", deviceId(), e.getMessage());
            return false;
        }
        try {
            FlowRuleService rules = handler().get(FlowRuleService.class);
            if (add) {
                rules.applyFlowRules(rule);
            } else {
                rules.removeFlowRules(rule);
            }
            return true;
        } catch (RuntimeException e) {
            log.warn("{}: INT objective failed: {}", deviceId(), e.getMessage());
            return false;
        }
    }

    /** The {@code int_watchlist} entry of an objective; IllegalArgumentException says why not. */
    FlowRule watchlistEntry(IntObjective obj) {
        PiCriterion.Builder match = PiCriterion.builder();
        int specified = 0;
        for (Criterion c : obj.selector().criteria()) {
            switch (c.type()) {
                case ETH_TYPE:
                    if (((EthTypeCriterion) c).ethType().toShort() != EthType.EtherType.IPV4.ethType().toShort()) {
                        throw new IllegalArgumentException("ETH_TYPE: INT rides on IPv4 only, not " + c);
                    }
                    break;
                case IPV4_SRC:
                case IPV4_DST:
                    IpPrefix prefix = ((IPCriterion) c).ip();
                    if (prefix.prefixLength() > 0) {
                        int mask = (int) (0xFFFF_FFFFL << (32 - prefix.prefixLength()));
                        match.matchTernary(c.type() == Criterion.Type.IPV4_SRC ? HDR_IPV4_SRC_ADDR
                                : HDR_IPV4_DST_ADDR, prefix.address().getIp4Address().toInt(), mask);
                        specified += prefix.prefixLength();
                    }
                    break;
                case IP_PROTO:
                    short proto = ((IPProtocolCriterion) c).protocol();
                    if (proto != IPv4.PROTOCOL_UDP) {
                        throw new IllegalArgumentException(
                                "IP_PROTO: INT rides on UDP only (17), not " + proto);
                    }
                    match.matchTernary(HDR_IPV4_PROTOCOL, proto, 0xFF);
                    specified += 8;
                    break;
                case UDP_SRC:
                case UDP_SRC_MASKED:
                case UDP_DST:
                case UDP_DST_MASKED:
                    UdpPortCriterion udp = (UdpPortCriterion) c;
                    int portMask = udp.mask() == null ? 0xFFFF : udp.mask().toInt();
                    boolean src = c.type() == Criterion.Type.UDP_SRC
                            || c.type() == Criterion.Type.UDP_SRC_MASKED;
                    match.matchTernary(src ? LOCAL_METADATA_L4_SRC_PORT : LOCAL_METADATA_L4_DST_PORT,
                            udp.udpPort().toInt() & portMask, portMask);
                    specified += Integer.bitCount(portMask);
                    break;
                case TCP_SRC:
                case TCP_SRC_MASKED:
                case TCP_DST:
                case TCP_DST_MASKED:
                    throw new IllegalArgumentException(c.type() + ": INT rides on UDP only");
                default:
                    throw new IllegalArgumentException(c.type() + ": not a field of the INT watchlist"
                            + " (IPV4_SRC, IPV4_DST, IP_PROTO, UDP_SRC, UDP_DST)");
            }
        }
        int bitmap = instructionBitmap(obj.metadataTypes());
        PiAction source = PiAction.builder()
                .withId(INGRESS_PIPE_INT_INGRESS_INT_SOURCE)
                .withParameter(new PiActionParam(REMAINING_HOP_CNT, MAX_HOPS))
                .withParameter(new PiActionParam(INSTRUCTION_BITMAP, (short) bitmap))
                .build();
        if (specified == 0) {
            // Every flow: a PiCriterion cannot be empty, and P4Runtime forbids all-zero masks.
            // The pipeline applies INT to UDP only, so matching UDP selects the same packets.
            match.matchTernary(HDR_IPV4_PROTOCOL, IPv4.PROTOCOL_UDP, 0xFF);
            specified = 8;
        }
        // More specific entries win: P4Runtime leaves overlapping entries of equal priority
        // undefined, and the objectives of ONOS's INT app may overlap.
        return entry(INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST, match.build(), 1 + specified, source);
    }

    /** Bitmap of the requested types, plus node ID and ports, less what the pipeline lacks. */
    static int instructionBitmap(Set<IntMetadataType> types) {
        int bitmap = ALWAYS;
        for (IntMetadataType t : types) {
            bitmap |= BITS.getOrDefault(t, 0);
        }
        return bitmap & INT_FULL_BITMAP_SUPPORTED;
    }

    @Override
    public boolean setupIntConfig(IntDeviceConfig config) {
        try {
            if (!config.enabled()) {
                removeReport();
                return true;
            }
            // ONOS's builder fills what the operator left out with zeros; ONOS 2.7's INT app
            // only ever sets the collector's address and port (from its netcfg).
            String missing = config.spec() != IntDeviceConfig.TelemetrySpec.INT ? "spec: INT only"
                    : !usable(config.collectorIp()) ? "collectorIp: an IPv4 address is needed"
                    : config.collectorPort() == null || config.collectorPort().toInt() == 0
                    ? "collectorPort: a UDP port is needed"
                    : config.sinkIp() != null && !config.sinkIp().isZero() && !config.sinkIp().isIp4()
                    ? "sinkIp: IPv4 only" : null;
            if (missing != null) {
                log.warn("{}: INT report config refused: {}", deviceId(), missing);
                return false;
            }
            Optional<PortNumber> port = reportPort(config);
            if (port.isEmpty()) {
                log.warn("{}: no port towards INT collector {}: it is no host ONOS knows and the device"
                        + " has no {} annotation", deviceId(), config.collectorIp(), REPORT_PORT_ANNOTATION);
                return false;
            }
            int node = handler().get(IntSwitchIdService.class).switchId(deviceId());
            apply(reportEntry(config, node, nextHopMac(config)));
            cloneSession(port.get());
            return true;
        } catch (RuntimeException e) {
            log.warn("{}: INT report config failed: {}", deviceId(), e.getMessage());
            return false;
        }
    }

    /**
     * The report header's addresses. Without a sink IP and MAC (ONOS 2.7's INT app never sets
     * them) the switch's reports come from 169.254.H.L and 02:00:00:00:H:L, H.L being its node
     * ID: a link-local source the collector's kernel accepts (0.0.0.0 it drops as a martian),
     * and one that names the switch.
     */
    FlowRule reportEntry(IntDeviceConfig config, int node, MacAddress nextHop) {
        MacAddress src = config.sinkMac() != null && !config.sinkMac().equals(MacAddress.ZERO)
                ? config.sinkMac()
                : MacAddress.valueOf(new byte[]{2, 0, 0, 0, (byte) (node >> 8), (byte) node});
        IpAddress srcIp = usable(config.sinkIp()) ? config.sinkIp()
                : IpAddress.valueOf(IpAddress.Version.INET,
                        new byte[]{(byte) 169, (byte) 254, (byte) (node >> 8), (byte) node});
        return defaultEntry(EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR, PiAction.builder()
                .withId(EGRESS_PIPE_INT_REPORT_SET_COLLECTOR)
                .withParameter(new PiActionParam(SRC_MAC, src.toBytes()))
                .withParameter(new PiActionParam(DST_MAC, nextHop.toBytes()))
                .withParameter(new PiActionParam(SRC_IP, srcIp.toOctets()))
                .withParameter(new PiActionParam(COLLECTOR_IP, config.collectorIp().toOctets()))
                .withParameter(new PiActionParam(COLLECTOR_PORT, (short) config.collectorPort().toInt()))
                .build());
    }

    private static boolean usable(IpAddress ip) {
        return ip != null && ip.isIp4() && !ip.isZero();
    }

    /** The configured next-hop MAC, else the collector's own (an L2 fabric), else broadcast. */
    private MacAddress nextHopMac(IntDeviceConfig config) {
        MacAddress mac = config.collectorNextHopMac();
        if (mac != null && !mac.equals(MacAddress.ZERO)) {
            return mac;
        }
        return handler().get(HostService.class).getHostsByIp(config.collectorIp()).stream()
                .map(Host::mac).sorted(Comparator.comparing(MacAddress::toString)).findFirst()
                .orElse(MacAddress.BROADCAST);
    }

    /**
     * The port reports leave by: the device's {@value #REPORT_PORT_ANNOTATION} annotation, else
     * the collector's own port when it hangs on this device, else the first link of ONOS's
     * shortest path to the device it hangs on.
     */
    Optional<PortNumber> reportPort(IntDeviceConfig config) {
        Device device = handler().get(DeviceService.class).getDevice(deviceId());
        String annotated = device == null ? null : device.annotations().value(REPORT_PORT_ANNOTATION);
        if (annotated != null) {
            try {
                return Optional.of(PortNumber.portNumber(Long.parseLong(annotated.trim())));
            } catch (NumberFormatException e) {
                log.warn("{}: {}={} is not a port number", deviceId(), REPORT_PORT_ANNOTATION, annotated);
            }
        }
        Set<Host> collectors = handler().get(HostService.class).getHostsByIp(config.collectorIp());
        List<ConnectPoint> at = collectors.stream().map(Host::location)
                .sorted(Comparator.comparing(ConnectPoint::toString)).collect(Collectors.toList());
        for (ConnectPoint cp : at) {
            if (cp.deviceId().equals(deviceId())) {
                return Optional.of(cp.port());
            }
        }
        PathService paths = handler().get(PathService.class);
        return at.stream()
                .flatMap(cp -> paths.getPaths(deviceId(), cp.deviceId()).stream())
                .filter(p -> !p.links().isEmpty())
                .min(Comparator.comparingInt((Path p) -> p.links().size())
                        .thenComparing(p -> p.links().get(0).src().port().toLong()))
                .map(p -> p.links().get(0).src().port());
    }

    /** Clone session 500 as ONOS models it: a CLONE group whose one bucket outputs to the port. */
    private void cloneSession(PortNumber port) {
        GroupService groups = handler().get(GroupService.class);
        GroupBuckets buckets = new GroupBuckets(List.of(DefaultGroupBucket.createCloneGroupBucket(
                DefaultTrafficTreatment.builder().setOutput(port).build())));
        Group existing = groups.getGroup(deviceId(), REPORT_GROUP_KEY);
        if (existing != null && existing.state() == Group.GroupState.PENDING_DELETE) {
            // cleanup() just removed it (ONOS's INT app cleans up before every pass): a group
            // on its way out is no clone session; add it again once it is gone.
            existing = awaitGroupGone(groups) ? null : existing;
        }
        if (existing == null) {
            groups.addGroup(new DefaultGroupDescription(deviceId(), GroupDescription.Type.CLONE,
                    buckets, REPORT_GROUP_KEY, REPORT_CLONE_SESSION, appId()));
        } else if (!existing.buckets().equals(buckets)) {
            groups.setBucketsForGroup(deviceId(), REPORT_GROUP_KEY, buckets, REPORT_GROUP_KEY, appId());
        }
    }

    private void removeReport() {
        FlowRuleService rules = handler().get(FlowRuleService.class);
        ours(rules).stream()
                .filter(f -> EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR.equals(f.table()))
                .forEach(rules::removeFlowRules);
        GroupService groups = handler().get(GroupService.class);
        if (groups.getGroup(deviceId(), REPORT_GROUP_KEY) != null) {
            groups.removeGroup(deviceId(), REPORT_GROUP_KEY, appId());
        }
    }

    @Override
    public void cleanup() {
        try {
            FlowRuleService rules = handler().get(FlowRuleService.class);
            ours(rules).stream().filter(f -> INT_TABLES.contains(f.table())).forEach(rules::removeFlowRules);
            GroupService groups = handler().get(GroupService.class);
            if (groups.getGroup(deviceId(), REPORT_GROUP_KEY) != null) {
                groups.removeGroup(deviceId(), REPORT_GROUP_KEY, appId());
                awaitGroupGone(groups);
            }
        } catch (RuntimeException e) {
            log.warn("{}: INT cleanup failed: {}", deviceId(), e.getMessage());
        }
    }

    /**
     * Waits (at most {@link #CLEANUP_WAIT_MS}) until the report clone group is gone from ONOS's
     * group store; true if it is. A group removed and added again at once was lost on bmv2:
     * the add saw the group still there, PENDING_DELETE, and the removal then completed.
     */
    private boolean awaitGroupGone(GroupService groups) {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CLEANUP_WAIT_MS);
        while (groups.getGroup(deviceId(), REPORT_GROUP_KEY) != null) {
            if (System.nanoTime() > deadline) {
                log.warn("{}: the INT report group is still not removed after {} ms", deviceId(),
                         CLEANUP_WAIT_MS);
                return false;
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
        }
        return true;
    }

    private List<FlowEntry> ours(FlowRuleService rules) {
        short app = appId().id();
        return StreamSupport.stream(rules.getFlowEntries(deviceId()).spliterator(), false)
                .filter(f -> f.appId() == app && f.table().type() == TableId.Type.PIPELINE_INDEPENDENT)
                .collect(Collectors.toList());
    }

    @Override
    public boolean supportsFunctionality(IntFunctionality functionality) {
        switch (functionality) {
            case SOURCE:
            case SINK:
            case TRANSIT:
                return true;
            default:
                return false;  // POSTCARD: the pipeline reports from the sink only
        }
    }

    private void apply(FlowRule rule) {
        handler().get(FlowRuleService.class).applyFlowRules(rule);
    }

    /** A keyless table's entry is its default action (ONOS: an empty selector). */
    private FlowRule defaultEntry(PiTableId table, PiAction action) {
        return DefaultFlowRule.builder()
                .forDevice(deviceId()).forTable(table).fromApp(appId())
                .withSelector(DefaultTrafficSelector.emptySelector())
                .withTreatment(DefaultTrafficTreatment.builder().piTableAction(action).build())
                .withPriority(0).makePermanent().build();
    }

    private FlowRule entry(PiTableId table, PiCriterion match, int priority, PiAction action) {
        return DefaultFlowRule.builder()
                .forDevice(deviceId()).forTable(table).fromApp(appId())
                .withSelector(DefaultTrafficSelector.builder().matchPi(match).build())
                .withTreatment(DefaultTrafficTreatment.builder().piTableAction(action).build())
                .withPriority(priority).makePermanent().build();
    }
}
