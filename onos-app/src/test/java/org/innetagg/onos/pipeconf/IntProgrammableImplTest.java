package org.innetagg.onos.pipeconf;

import org.innetagg.onos.TestElements;
import org.innetagg.onos.aggregation.AggregationManager;
import org.innetagg.onos.telemetry.InMemoryNetworkConfig;
import org.innetagg.onos.telemetry.IntSwitchIdManager;
import org.innetagg.onos.telemetry.IntSwitchIdService;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.Test;
import org.onlab.graph.ScalarWeight;
import org.onlab.packet.IPv4;
import org.onlab.packet.IpAddress;
import org.onlab.packet.IpPrefix;
import org.onlab.packet.MacAddress;
import org.onlab.packet.TpPort;
import org.onlab.packet.VlanId;
import org.onosproject.core.ApplicationId;
import org.onosproject.core.CoreService;
import org.onosproject.core.CoreServiceAdapter;
import org.onosproject.core.DefaultApplicationId;
import org.onosproject.core.GroupId;
import org.onosproject.net.DefaultPath;
import org.onosproject.net.Device;
import org.onosproject.net.DeviceId;
import org.onosproject.net.ElementId;
import org.onosproject.net.Host;
import org.onosproject.net.HostId;
import org.onosproject.net.HostLocation;
import org.onosproject.net.Link;

import org.onosproject.net.PortNumber;
import org.onosproject.net.behaviour.inbandtelemetry.IntDeviceConfig;
import org.onosproject.net.behaviour.inbandtelemetry.IntMetadataType;
import org.onosproject.net.behaviour.inbandtelemetry.IntObjective;
import org.onosproject.net.behaviour.inbandtelemetry.IntProgrammable;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.device.DeviceServiceAdapter;
import org.onosproject.net.driver.Behaviour;
import org.onosproject.net.driver.DefaultDriverData;
import org.onosproject.net.driver.Driver;
import org.onosproject.net.driver.DriverAdapter;
import org.onosproject.net.driver.DriverData;
import org.onosproject.net.driver.DriverHandler;
import org.onosproject.net.flow.DefaultFlowEntry;
import org.onosproject.net.flow.DefaultFlowRule;
import org.onosproject.net.flow.DefaultTrafficSelector;
import org.onosproject.net.flow.DefaultTrafficTreatment;
import org.onosproject.net.flow.FlowEntry;
import org.onosproject.net.flow.FlowRule;
import org.onosproject.net.flow.FlowRuleService;
import org.onosproject.net.flow.FlowRuleServiceAdapter;
import org.onosproject.net.flow.criteria.PiCriterion;
import org.onosproject.net.flow.instructions.Instructions;
import org.onosproject.net.group.DefaultGroup;
import org.onosproject.net.group.Group;
import org.onosproject.net.group.GroupBuckets;
import org.onosproject.net.group.GroupDescription;
import org.onosproject.net.group.GroupKey;
import org.onosproject.net.group.GroupService;
import org.onosproject.net.group.GroupServiceAdapter;
import org.onosproject.net.host.HostService;
import org.onosproject.net.host.HostServiceAdapter;
import org.onosproject.net.pi.model.PiPipelineModel;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiFieldMatch;
import org.onosproject.net.pi.runtime.PiTernaryFieldMatch;
import org.onosproject.net.topology.PathService;
import org.onosproject.net.topology.PathServiceAdapter;


import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;

import static org.innetagg.onos.TestElements.PID;
import static org.innetagg.onos.TestElements.host;
import static org.innetagg.onos.TestElements.link;
import static org.innetagg.onos.pipeconf.P4InfoConstants.COLLECTOR_IP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.COLLECTOR_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.DST_MAC;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_EGRESS_INT_SET_SWITCH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_EGRESS_INT_SWITCH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PIPE_INT_REPORT_SET_COLLECTOR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_DST_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_PROTOCOL;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_SRC_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_AGGREGATION_AGG_JOB;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SET_SINK;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SINK;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_SOURCE;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INSTRUCTION_BITMAP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.LOCAL_METADATA_L4_DST_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.REMAINING_HOP_CNT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.REPORT_CLONE_SESSION;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SRC_IP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SRC_MAC;
import static org.innetagg.onos.pipeconf.P4InfoConstants.SWITCH_ID;
import static org.innetagg.onos.pipeconf.PipelineModelCheck.assertFits;
import static org.innetagg.onos.pipeconf.PipelineModelCheck.param;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

/**
 * The IntProgrammable behaviour as ONOS's INT app drives it, on leaf1 -- spine1 -- leaf2 with
 * the collector (10.0.0.254) on leaf2 port 1, through ONOS's service adapters. Every rule is
 * checked against the pipeline model ONOS parses from our P4Info.
 */
public class IntProgrammableImplTest {
    private static final ApplicationId APP = new DefaultApplicationId(7, AggregationManager.APP_NAME);
    private static final DeviceId LEAF1 = DeviceId.deviceId("device:bmv2:leaf1");
    private static final DeviceId SPINE1 = DeviceId.deviceId("device:bmv2:spine1");
    private static final DeviceId LEAF2 = DeviceId.deviceId("device:bmv2:leaf2");
    private static final IpAddress COLLECTOR = IpAddress.valueOf("10.0.0.254");
    private static final List<Link> LINKS = List.of(
            link(LEAF1, 2, SPINE1, 1), link(SPINE1, 1, LEAF1, 2),
            link(SPINE1, 2, LEAF2, 3), link(LEAF2, 3, SPINE1, 2));

    private static PiPipelineModel model;

    private final Map<DeviceId, Device> devices = new LinkedHashMap<>();
    private final Map<Class<?>, Object> services = new HashMap<>();
    private final Set<Host> hosts = new java.util.HashSet<>();
    private RecordingFlowRules rules;
    private RecordingGroups groups;
    private InMemoryNetworkConfig netcfg;

    @BeforeClass
    public static void parseP4Info() throws Exception {
        model = PipeconfLoader.pipelineModel(java.nio.file.Path.of(System.getProperty("innetagg.onos.p4info")).toUri().toURL());
    }

    private void device(DeviceId id, String... annotations) {
        devices.put(id, TestElements.device(id, annotations));
    }

    @Before
    public void setUp() {
        device(LEAF1);
        device(SPINE1);
        device(LEAF2);
        hosts.add(host(HostId.hostId("00:00:00:00:00:fe/None"), LEAF2, 1, COLLECTOR));
        rules = new RecordingFlowRules();
        groups = new RecordingGroups();
        netcfg = new InMemoryNetworkConfig();
        DeviceService deviceService = new DeviceServiceAdapter() {
            @Override
            public Device getDevice(DeviceId id) {
                return devices.get(id);
            }

            @Override
            public Iterable<Device> getDevices() {
                return List.copyOf(devices.values());
            }
        };
        IntSwitchIdManager ids = new IntSwitchIdManager();
        ids.deviceService = deviceService;
        ids.netcfgService = netcfg;
        ids.storageService = new org.onosproject.store.service.TestStorageService();
        ids.activate();
        services.put(CoreService.class, new CoreServiceAdapter() {
            @Override
            public ApplicationId getAppId(String name) {
                return AggregationManager.APP_NAME.equals(name) ? APP : null;
            }
        });
        services.put(IntSwitchIdService.class, ids);
        services.put(DeviceService.class, deviceService);
        services.put(FlowRuleService.class, rules);
        services.put(GroupService.class, groups);
        services.put(HostService.class, new HostServiceAdapter() {
            @Override
            public Set<Host> getHostsByIp(IpAddress ip) {
                return hosts.stream().filter(h -> h.ipAddresses().contains(ip)).collect(Collectors.toSet());
            }
        });
        services.put(PathService.class, new PathServiceAdapter() {
            @Override
            public Set<org.onosproject.net.Path> getPaths(ElementId src, ElementId dst) {
                return shortestPath((DeviceId) src, (DeviceId) dst);
            }
        });
    }

    /** Breadth-first over LINKS: ONOS's PathService answers the same on this tree. */
    private static Set<org.onosproject.net.Path> shortestPath(DeviceId src, DeviceId dst) {
        Map<DeviceId, Link> via = new HashMap<>();
        List<DeviceId> frontier = new ArrayList<>(List.of(src));
        while (!frontier.isEmpty() && !via.containsKey(dst)) {
            List<DeviceId> next = new ArrayList<>();
            for (DeviceId d : frontier) {
                for (Link l : LINKS) {
                    DeviceId to = l.dst().deviceId();
                    if (l.src().deviceId().equals(d) && !to.equals(src) && !via.containsKey(to)) {
                        via.put(to, l);
                        next.add(to);
                    }
                }
            }
            frontier = next;
        }
        if (!via.containsKey(dst) || src.equals(dst)) {
            return Set.of();
        }
        List<Link> links = new ArrayList<>();
        for (DeviceId d = dst; !d.equals(src); d = via.get(d).src().deviceId()) {
            links.add(0, via.get(d));
        }
        return Set.of(new DefaultPath(PID, links, ScalarWeight.toWeight(links.size())));
    }

    private IntProgrammable behaviour(DeviceId device) {
        IntProgrammableImpl b = new IntProgrammableImpl();
        DriverData data = new DefaultDriverData(new DriverAdapter(), device);
        b.setData(data);
        b.setHandler(new DriverHandler() {
            @Override
            public Driver driver() {
                return data.driver();
            }

            @Override
            public DriverData data() {
                return data;
            }

            @Override
            public <T extends Behaviour> T behaviour(Class<T> behaviourClass) {
                throw new UnsupportedOperationException();
            }

            @Override
            @SuppressWarnings("unchecked")
            public <T> T get(Class<T> serviceClass) {
                return (T) services.get(serviceClass);
            }
        });
        return b;
    }

    private static IntDeviceConfig reportConfig(boolean enabled) {
        return IntDeviceConfig.builder()
                .enabled(enabled)
                .withTelemetrySpec(IntDeviceConfig.TelemetrySpec.INT)
                .withCollectorIp(COLLECTOR)
                .withCollectorPort(TpPort.tpPort(32766))
                .withCollectorNextHopMac(MacAddress.valueOf("00:00:00:00:00:fe"))
                .withSinkIp(IpAddress.valueOf("10.0.0.1"))
                .withSinkMac(MacAddress.valueOf("00:aa:00:00:00:01"))
                .build();
    }

    private List<FlowRule> appliedTo(org.onosproject.net.pi.model.PiTableId table) {
        return rules.applied.stream().filter(r -> r.table().equals(table)).collect(Collectors.toList());
    }

    @Test
    public void thePipeconfOffersTheBehaviour() {
        assertTrue(PipeconfLoader.buildPipeconf().hasBehaviour(IntProgrammable.class));
        IntProgrammable b = behaviour(LEAF1);
        assertTrue(b.supportsFunctionality(IntProgrammable.IntFunctionality.SOURCE));
        assertTrue(b.supportsFunctionality(IntProgrammable.IntFunctionality.TRANSIT));
        assertTrue(b.supportsFunctionality(IntProgrammable.IntFunctionality.SINK));
        assertFalse(b.supportsFunctionality(IntProgrammable.IntFunctionality.POSTCARD));
    }

    @Test
    public void initSetsEachSwitchsOwnNodeId() {
        assertTrue(behaviour(LEAF1).init());
        assertTrue(behaviour(SPINE1).init());
        assertTrue(behaviour(LEAF1).init());  // again: same number
        List<FlowRule> switchRules = appliedTo(EGRESS_PIPE_INT_EGRESS_INT_SWITCH);
        assertEquals(3, switchRules.size());
        List<Long> ids = new ArrayList<>();
        for (FlowRule r : switchRules) {
            PiAction a = assertFits(r, model);
            assertEquals(EGRESS_PIPE_INT_EGRESS_INT_SET_SWITCH, a.id());
            ids.add(param(a, SWITCH_ID));
        }
        assertEquals(List.of(1L, 2L, 1L), ids);
        assertEquals(LEAF1, switchRules.get(0).deviceId());
        assertEquals(APP.id(), switchRules.get(0).appId());
        // The optimizer maps INT rows to devices by this annotation (docs/service.md).
        assertEquals("2", netcfg.annotations.get(SPINE1).path("entries").path("intSwitchId").asText());
    }

    @Test
    public void anObjectiveBecomesOneWatchlistEntry() {
        IntObjective obj = IntObjective.builder()
                .withSelector(DefaultTrafficSelector.builder()
                        .matchIPSrc(IpPrefix.valueOf("10.0.1.0/24"))
                        .matchIPDst(IpPrefix.valueOf("10.0.2.7/32"))
                        .matchIPProtocol(IPv4.PROTOCOL_UDP)
                        .matchUdpDst(TpPort.tpPort(48879))
                        .build())
                .withMetadataTypes(Set.of(IntMetadataType.HOP_LATENCY, IntMetadataType.QUEUE_OCCUPANCY,
                        IntMetadataType.L2_PORT_ID))
                .build();
        assertTrue(behaviour(LEAF1).addIntObjective(obj));
        FlowRule rule = appliedTo(INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST).get(0);
        PiAction a = assertFits(rule, model);
        assertEquals(INGRESS_PIPE_INT_INGRESS_INT_SOURCE, a.id());
        // node ID + L1 ports always, latency + queue asked, L2 ports (bit 6) not in the pipeline.
        assertEquals(0xF000, param(a, INSTRUCTION_BITMAP));
        assertEquals(IntProgrammableImpl.MAX_HOPS, param(a, REMAINING_HOP_CNT));
        Map<Object, PiTernaryFieldMatch> m = ternaries(rule);
        assertTernary(m.get(HDR_IPV4_SRC_ADDR), 0x0A000100L, 0xFFFFFF00L);
        assertTernary(m.get(HDR_IPV4_DST_ADDR), 0x0A000207L, 0xFFFFFFFFL);
        assertTernary(m.get(HDR_IPV4_PROTOCOL), 17, 0xFF);
        assertTernary(m.get(LOCAL_METADATA_L4_DST_PORT), 48879, 0xFFFF);
        assertEquals(4, m.size());
        assertEquals(1 + 24 + 32 + 8 + 16, rule.priority());  // more specific entries win

        assertTrue(behaviour(LEAF1).removeIntObjective(obj));
        assertEquals(List.of(rule), rules.removed);
    }

    @Test
    public void anObjectiveWithoutCriteriaWatchesAllUdpAndAllTypesMapOneToOne() {
        IntObjective all = IntObjective.builder()
                .withSelector(DefaultTrafficSelector.emptySelector())
                .withMetadataTypes(Set.of(IntMetadataType.values()))
                .build();
        assertTrue(behaviour(LEAF1).addIntObjective(all));
        FlowRule rule = appliedTo(INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST).get(0);
        PiAction a = assertFits(rule, model);
        assertEquals(P4InfoConstants.INT_FULL_BITMAP_SUPPORTED, param(a, INSTRUCTION_BITMAP));
        assertEquals(0xFD00, param(a, INSTRUCTION_BITMAP));
        Map<Object, PiTernaryFieldMatch> m = ternaries(rule);
        assertEquals(1, m.size());
        assertTernary(m.get(HDR_IPV4_PROTOCOL), 17, 0xFF);
    }

    @Test
    public void objectivesThePipelineCannotHonourAreRefusedAndWriteNothing() {
        IntProgrammable b = behaviour(LEAF1);
        assertFalse(b.addIntObjective(objective(DefaultTrafficSelector.builder()
                .matchIPProtocol(IPv4.PROTOCOL_TCP).matchTcpDst(TpPort.tpPort(80)).build())));
        assertFalse(b.addIntObjective(objective(DefaultTrafficSelector.builder()
                .matchTcpSrc(TpPort.tpPort(80)).build())));
        assertFalse(b.addIntObjective(objective(DefaultTrafficSelector.builder()
                .matchVlanId(VlanId.vlanId((short) 10)).build())));
        assertFalse(b.addIntObjective(objective(DefaultTrafficSelector.builder()
                .matchEthType((short) 0x86DD).build())));
        assertTrue(rules.applied.isEmpty());
        // IPv4 ethertype is what every INT objective of ONOS's app carries: accepted.
        assertTrue(b.addIntObjective(objective(DefaultTrafficSelector.builder()
                .matchEthType((short) 0x0800).matchUdpSrc(TpPort.tpPort(5000)).build())));
    }

    private static IntObjective objective(org.onosproject.net.flow.TrafficSelector selector) {
        return IntObjective.builder().withSelector(selector)
                .withMetadataTypes(Set.of(IntMetadataType.SWITCH_ID)).build();
    }

    @Test
    public void sinkPortsBecomeIntSinkEntries() {
        IntProgrammable b = behaviour(LEAF2);
        assertTrue(b.setSinkPort(PortNumber.portNumber(1)));
        assertTrue(b.setSourcePort(PortNumber.portNumber(1)));  // by watchlist: nothing to write
        assertFalse(b.setSinkPort(PortNumber.CONTROLLER));
        assertFalse(b.setSinkPort(PortNumber.portNumber(512)));  // 9-bit ports
        assertEquals(1, rules.applied.size());
        FlowRule rule = rules.applied.get(0);
        assertEquals(INGRESS_PIPE_INT_INGRESS_INT_SINK, rule.table());
        assertEquals(INGRESS_PIPE_INT_INGRESS_INT_SET_SINK, assertFits(rule, model).id());
        PiFieldMatch m = ((PiCriterion) rule.selector().criteria().iterator().next()).fieldMatches()
                .iterator().next();
        assertEquals(EGRESS_PORT, m.fieldId());
        assertEquals(1, ((org.onosproject.net.pi.runtime.PiExactFieldMatch) m).value().asReadOnlyBuffer()
                .get(((org.onosproject.net.pi.runtime.PiExactFieldMatch) m).value().size() - 1));
    }

    @Test
    public void reportsGoFromTheSinkTowardsTheCollector() {
        // leaf2: the collector hangs on port 1; leaf1: the path to leaf2 leaves by port 2.
        assertTrue(behaviour(LEAF2).setupIntConfig(reportConfig(true)));
        assertTrue(behaviour(LEAF1).setupIntConfig(reportConfig(true)));
        assertEquals(1, cloneOutput(LEAF2));
        assertEquals(2, cloneOutput(LEAF1));
        FlowRule report = appliedTo(EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR).get(0);
        PiAction a = assertFits(report, model);
        assertEquals(EGRESS_PIPE_INT_REPORT_SET_COLLECTOR, a.id());
        assertEquals(0x0A0000FEL, param(a, COLLECTOR_IP));
        assertEquals(32766, param(a, COLLECTOR_PORT));
        assertEquals(0x0A000001L, param(a, SRC_IP));
        assertEquals(0x00AA00000001L, param(a, SRC_MAC));
        assertEquals(0x0000000000FEL, param(a, DST_MAC));
        Group g = groups.getGroup(LEAF2, IntProgrammableImpl.REPORT_GROUP_KEY);
        assertEquals(GroupDescription.Type.CLONE, g.type());
        assertEquals(REPORT_CLONE_SESSION, g.id().id().intValue());
        assertEquals(APP, g.appId());
    }

    @Test
    public void whatOnos27sIntAppLeavesOutIsFilledFromTheCollectorHostAndTheNodeId() {
        // ONOS 2.7's INT app builds the config from its netcfg: collector address and port only.
        IntDeviceConfig cfg = IntDeviceConfig.builder().enabled(true)
                .withCollectorIp(COLLECTOR).withCollectorPort(TpPort.tpPort(32766)).build();
        assertTrue(behaviour(SPINE1).init());  // node 1
        assertTrue(behaviour(LEAF1).setupIntConfig(cfg));  // node 2
        PiAction a = assertFits(appliedTo(EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR).get(0), model);
        assertEquals(0x0000000000FEL, param(a, DST_MAC));  // the collector host's MAC
        assertEquals(0x020000000002L, param(a, SRC_MAC));
        assertEquals(0xA9FE0002L, param(a, SRC_IP));  // 169.254.0.2
        assertEquals(0x0A0000FEL, param(a, COLLECTOR_IP));
    }

    @Test
    public void anAnnotatedReportPortWinsAndAMovedCollectorUpdatesTheSession() {
        device(LEAF1, IntProgrammableImpl.REPORT_PORT_ANNOTATION, "7");
        assertTrue(behaviour(LEAF1).setupIntConfig(reportConfig(true)));
        assertEquals(7, cloneOutput(LEAF1));
        device(LEAF1);  // annotation gone: follow the path again
        assertTrue(behaviour(LEAF1).setupIntConfig(reportConfig(true)));
        assertEquals(2, cloneOutput(LEAF1));
        assertEquals(1, groups.bucketUpdates);
        assertTrue(behaviour(LEAF1).setupIntConfig(reportConfig(true)));
        assertEquals(1, groups.bucketUpdates);  // unchanged: nothing rewritten
    }

    @Test
    public void anUnknownCollectorOrIncompleteConfigIsRefusedAndWritesNothing() {
        hosts.clear();
        assertFalse(behaviour(LEAF1).setupIntConfig(reportConfig(true)));
        device(LEAF1, IntProgrammableImpl.REPORT_PORT_ANNOTATION, "2");
        IntDeviceConfig noPort = IntDeviceConfig.builder().enabled(true)
                .withCollectorIp(COLLECTOR).withSinkIp(IpAddress.valueOf("10.0.0.1")).build();
        assertFalse(behaviour(LEAF1).setupIntConfig(noPort));
        IntDeviceConfig v6 = IntDeviceConfig.builder().enabled(true)
                .withCollectorIp(IpAddress.valueOf("2001:db8::1")).withCollectorPort(TpPort.tpPort(32766))
                .withSinkIp(IpAddress.valueOf("10.0.0.1")).build();
        assertFalse(behaviour(LEAF1).setupIntConfig(v6));
        assertTrue(rules.applied.isEmpty());
        assertTrue(groups.groups.isEmpty());
    }

    @Test
    public void disablingAndCleanupRemoveOnlyOurIntState() {
        IntProgrammable b = behaviour(LEAF2);
        assertTrue(b.init());
        assertTrue(b.setSinkPort(PortNumber.portNumber(1)));
        assertTrue(b.setupIntConfig(reportConfig(true)));
        assertTrue(b.addIntObjective(objective(DefaultTrafficSelector.emptySelector())));
        FlowRule aggJob = DefaultFlowRule.builder().forDevice(LEAF2).forTable(INGRESS_PIPE_AGGREGATION_AGG_JOB)
                .fromApp(APP).withPriority(0).makePermanent()
                .withSelector(DefaultTrafficSelector.builder().matchPi(PiCriterion.builder()
                        .matchExact(P4InfoConstants.JOB_ID, 1).build()).build())
                .withTreatment(DefaultTrafficTreatment.builder().add(Instructions.createNoAction()).build())
                .build();
        FlowRule otherApps = DefaultFlowRule.builder().forDevice(LEAF2).forTable(INGRESS_PIPE_INT_INGRESS_INT_SINK)
                .fromApp(new DefaultApplicationId(9, "other")).withPriority(0).makePermanent()
                .withSelector(DefaultTrafficSelector.builder().matchPi(PiCriterion.builder()
                        .matchExact(EGRESS_PORT, 9).build()).build())
                .withTreatment(DefaultTrafficTreatment.emptyTreatment()).build();
        rules.applyFlowRules(aggJob, otherApps);

        assertTrue(b.setupIntConfig(reportConfig(false)));
        assertEquals(1, rules.removed.size());
        assertEquals(EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR, rules.removed.get(0).table());
        assertNull(groups.getGroup(LEAF2, IntProgrammableImpl.REPORT_GROUP_KEY));

        assertTrue(b.setupIntConfig(reportConfig(true)));
        rules.removed.clear();
        b.cleanup();
        Set<Object> removedTables = rules.removed.stream().map(FlowRule::table).collect(Collectors.toSet());
        assertEquals(Set.of(EGRESS_PIPE_INT_EGRESS_INT_SWITCH, INGRESS_PIPE_INT_INGRESS_INT_SINK,
                INGRESS_PIPE_INT_INGRESS_INT_WATCHLIST, EGRESS_PIPE_INT_REPORT_REPORT_COLLECTOR), removedTables);
        assertFalse(rules.removed.contains(aggJob));
        assertFalse(rules.removed.contains(otherApps));
        assertNull(groups.getGroup(LEAF2, IntProgrammableImpl.REPORT_GROUP_KEY));
    }

    /**
     * The INT app's sequence on leaf1 -- spine1 -- leaf2 (hosts 10.0.0.1 on leaf1/1, 10.0.0.2 on
     * leaf2/2, the collector on leaf2/1): init everywhere; on the edge switches the report
     * config, source and sink ports for host ports, and the objective. What it writes goes to
     * target/int-entries.json, which tests/p4/test_bmv2_onos_int.py loads into three bmv2
     * switches to check that INT reports really come out (bmv2 runs there, ONOS does not).
     */
    @Test
    public void theIntAppsSequenceOnAChainExportedForBmv2() throws Exception {
        hosts.add(host(HostId.hostId("00:00:00:00:00:01/None"), LEAF1, 1, IpAddress.valueOf("10.0.0.1")));
        hosts.add(host(HostId.hostId("00:00:00:00:00:02/None"), LEAF2, 2, IpAddress.valueOf("10.0.0.2")));
        IntObjective obj = IntObjective.builder()
                .withSelector(DefaultTrafficSelector.builder().matchEthType((short) 0x0800)
                        .matchIPSrc(IpPrefix.valueOf("10.0.0.1/32")).matchUdpDst(TpPort.tpPort(5000)).build())
                .withMetadataTypes(Set.of(IntMetadataType.HOP_LATENCY, IntMetadataType.QUEUE_OCCUPANCY))
                .build();
        // As ONOS 2.7's INT app builds it from its netcfg: the collector's address and port only.
        IntDeviceConfig onos27Config = IntDeviceConfig.builder().enabled(true)
                .withCollectorIp(COLLECTOR).withCollectorPort(TpPort.tpPort(32766)).build();
        com.fasterxml.jackson.databind.ObjectMapper mapper = new com.fasterxml.jackson.databind.ObjectMapper();
        com.fasterxml.jackson.databind.node.ObjectNode out = mapper.createObjectNode();
        for (DeviceId d : List.of(LEAF1, SPINE1, LEAF2)) {
            IntProgrammable b = behaviour(d);
            assertTrue(b.init());
            Set<PortNumber> hostPorts = hosts.stream().map(Host::location).filter(l -> l.deviceId().equals(d))
                    .map(HostLocation::port).collect(Collectors.toCollection(() -> new java.util.TreeSet<>(java.util.Comparator.comparingLong(PortNumber::toLong))));
            if (!hostPorts.isEmpty()) {
                assertTrue(b.setupIntConfig(onos27Config));
                for (PortNumber p : hostPorts) {
                    assertTrue(b.setSourcePort(p));
                    assertTrue(b.setSinkPort(p));
                }
                assertTrue(b.addIntObjective(obj));
            }
            com.fasterxml.jackson.databind.node.ObjectNode dev = out.putObject(d.toString());
            com.fasterxml.jackson.databind.node.ArrayNode entries = dev.putArray("entries");
            for (FlowRule r : rules.applied) {
                if (r.deviceId().equals(d)) {
                    entries.add(bmv2Entry(r));
                }
            }
            Group g = groups.getGroup(d, IntProgrammableImpl.REPORT_GROUP_KEY);
            if (g != null) {
                dev.putObject("clone_sessions").put(Integer.toString(g.id().id()), cloneOutput(d));
            }
        }
        // transit: node ID only; edges: node ID, report, one sink per host port, the watchlist.
        assertEquals(1, out.get(SPINE1.toString()).get("entries").size());
        assertEquals(1 + 1 + 2 + 1, out.get(LEAF2.toString()).get("entries").size());
        java.nio.file.Files.writeString(java.nio.file.Path.of("target", "int-entries.json"),
                mapper.writerWithDefaultPrettyPrinter().writeValueAsString(out));
    }

    /** A flow rule as a P4Runtime table entry: names and unsigned values, from the PI objects. */
    private static com.fasterxml.jackson.databind.node.ObjectNode bmv2Entry(FlowRule r) {
        PiAction a = assertFits(r, model);
        com.fasterxml.jackson.databind.node.ObjectNode e =
                new com.fasterxml.jackson.databind.ObjectMapper().createObjectNode();
        e.put("table", r.table().toString());
        e.put("default", r.selector().criteria().isEmpty());
        e.put("priority", r.priority());
        com.fasterxml.jackson.databind.node.ObjectNode match = e.putObject("match");
        if (!r.selector().criteria().isEmpty()) {
            for (PiFieldMatch m : ((PiCriterion) r.selector().criteria().iterator().next()).fieldMatches()) {
                com.fasterxml.jackson.databind.node.ObjectNode f = match.putObject(m.fieldId().toString());
                if (m instanceof PiTernaryFieldMatch) {
                    f.put("value", unsigned(((PiTernaryFieldMatch) m).value().asArray()));
                    f.put("mask", unsigned(((PiTernaryFieldMatch) m).mask().asArray()));
                } else {
                    f.put("value", unsigned(((org.onosproject.net.pi.runtime.PiExactFieldMatch) m).value().asArray()));
                }
            }
        }
        e.put("action", a.id().toString());
        com.fasterxml.jackson.databind.node.ObjectNode params = e.putObject("params");
        a.parameters().forEach(p -> params.put(p.id().toString(), unsigned(p.value().asArray())));
        return e;
    }

    private long cloneOutput(DeviceId device) {
        Group g = groups.getGroup(device, IntProgrammableImpl.REPORT_GROUP_KEY);
        assertNotNull("no clone session on " + device, g);
        assertEquals(1, g.buckets().buckets().size());
        return ((Instructions.OutputInstruction) g.buckets().buckets().get(0).treatment().allInstructions()
                .get(0)).port().toLong();
    }

    private static Map<Object, PiTernaryFieldMatch> ternaries(FlowRule rule) {
        return ((PiCriterion) rule.selector().criteria().iterator().next()).fieldMatches().stream()
                .collect(Collectors.toMap(PiFieldMatch::fieldId, m -> (PiTernaryFieldMatch) m));
    }

    private static void assertTernary(PiTernaryFieldMatch m, long value, long mask) {
        assertNotNull(m);
        assertEquals(value, unsigned(m.value().asArray()));
        assertEquals(mask, unsigned(m.mask().asArray()));
    }

    private static long unsigned(byte[] b) {
        long v = 0;
        for (byte x : b) {
            v = (v << 8) | (x & 0xFF);
        }
        return v;
    }

    /**
     * ONOS's INT app calls cleanup() and then programs the device again at once: the report
     * group, removed but still PENDING_DELETE in ONOS's store, must be added again once gone,
     * not taken for present (on bmv2 a second pass left the switch without its clone session).
     */
    @Test
    public void aPassRightAfterCleanupAddsTheReportGroupAgain() {
        IntProgrammable b = behaviour(LEAF2);
        assertTrue(b.init());
        assertTrue(b.setupIntConfig(reportConfig(true)));
        assertNotNull(groups.getGroup(LEAF2, IntProgrammableImpl.REPORT_GROUP_KEY));
        groups.deleteDelayMs = 300;
        b.cleanup();
        assertTrue(b.init());
        assertTrue(b.setupIntConfig(reportConfig(true)));
        Group g = groups.getGroup(LEAF2, IntProgrammableImpl.REPORT_GROUP_KEY);
        assertNotNull("no report group after the pass", g);
        assertNotEquals(Group.GroupState.PENDING_DELETE, g.state());
    }

    /** Applied rules are the device's flow entries, as ONOS's store would hold them once added. */
    static final class RecordingFlowRules extends FlowRuleServiceAdapter {
        final List<FlowRule> applied = new ArrayList<>();
        final List<FlowRule> removed = new ArrayList<>();

        @Override
        public void applyFlowRules(FlowRule... flowRules) {
            applied.addAll(List.of(flowRules));
        }

        @Override
        public void removeFlowRules(FlowRule... flowRules) {
            removed.addAll(List.of(flowRules));
            applied.removeAll(List.of(flowRules));
        }

        @Override
        public Iterable<FlowEntry> getFlowEntries(DeviceId deviceId) {
            return applied.stream().filter(r -> r.deviceId().equals(deviceId))
                    .map(r -> (FlowEntry) new DefaultFlowEntry(r, FlowEntry.FlowEntryState.ADDED))
                    .collect(Collectors.toList());
        }
    }

    /** Groups by (device, key), as ONOS's group store answers once a group is added. */
    static final class RecordingGroups extends GroupServiceAdapter {
        final Map<List<Object>, Group> groups = new java.util.concurrent.ConcurrentHashMap<>();
        int bucketUpdates;

        @Override
        public void addGroup(GroupDescription d) {
            groups.put(List.of(d.deviceId(), d.appCookie()), new DefaultGroup(GroupId.valueOf(d.givenGroupId()), d));
        }

        @Override
        public Group getGroup(DeviceId deviceId, GroupKey appCookie) {
            return groups.get(List.of(deviceId, appCookie));
        }

        @Override
        public void setBucketsForGroup(DeviceId deviceId, GroupKey oldCookie, GroupBuckets buckets,
                                       GroupKey newCookie, ApplicationId appId) {
            Group old = groups.get(List.of(deviceId, oldCookie));
            GroupDescription d = new org.onosproject.net.group.DefaultGroupDescription(deviceId, old.type(),
                    buckets, newCookie, old.id().id(), appId);
            groups.put(List.of(deviceId, newCookie), new DefaultGroup(old.id(), d));
            bucketUpdates++;
        }

        @Override
        public void removeGroup(DeviceId deviceId, GroupKey appCookie, ApplicationId appId) {
            if (deleteDelayMs == 0) {
                groups.remove(List.of(deviceId, appCookie));
                return;
            }
            // As ONOS's group store: PENDING_DELETE until the device has confirmed.
            Group g = groups.get(List.of(deviceId, appCookie));
            ((DefaultGroup) g).setState(Group.GroupState.PENDING_DELETE);
            new Thread(() -> {
                try {
                    Thread.sleep(deleteDelayMs);
                } catch (InterruptedException e) {
                    return;
                }
                groups.remove(List.of(deviceId, appCookie), g);
            }).start();
        }

        /** Milliseconds a removed group stays PENDING_DELETE; 0: removed at once. */
        volatile long deleteDelayMs;
    }
}
