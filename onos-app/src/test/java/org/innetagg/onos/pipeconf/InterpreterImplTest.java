package org.innetagg.onos.pipeconf;

import org.junit.BeforeClass;
import org.junit.Test;
import org.onlab.packet.Ethernet;
import org.onlab.packet.MacAddress;
import org.onlab.util.ImmutableByteSequence;
import org.onosproject.net.DeviceId;
import org.onosproject.net.PortNumber;
import org.onosproject.net.flow.DefaultTrafficTreatment;
import org.onosproject.net.flow.criteria.Criterion;
import org.onosproject.net.packet.DefaultOutboundPacket;
import org.onosproject.net.packet.InboundPacket;
import org.onosproject.net.pi.model.PiActionId;
import org.onosproject.net.pi.model.PiActionModel;
import org.onosproject.net.pi.model.PiActionParamId;
import org.onosproject.net.pi.model.PiCounterId;
import org.onosproject.net.pi.model.PiMatchFieldId;
import org.onosproject.net.pi.model.PiPacketMetadataId;
import org.onosproject.net.pi.model.PiPacketOperationType;
import org.onosproject.net.pi.model.PiPipeconf;
import org.onosproject.net.pi.model.PiPipelineInterpreter.PiInterpreterException;
import org.onosproject.net.pi.model.PiPipelineModel;
import org.onosproject.net.pi.model.PiRegisterId;
import org.onosproject.net.pi.model.PiTableId;
import org.onosproject.net.pi.model.PiTableModel;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;
import org.onosproject.net.pi.runtime.PiPacketMetadata;
import org.onosproject.net.pi.runtime.PiPacketOperation;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;

import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_DROP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_SEND_TO_CPU;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_SET_EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_TABLE0;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PACKET_IN_INGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PACKET_OUT_EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PORT;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

/** The interpreter and the generated constants against the committed P4Info, parsed by ONOS. */
public class InterpreterImplTest {
    private static PiPipelineModel model;
    private final InterpreterImpl interpreter = new InterpreterImpl();

    @BeforeClass
    public static void parseP4Info() throws Exception {
        // The copy the bundle carries: the committed P4Info minus fields ONOS 2.7 cannot parse.
        model = PipeconfLoader.pipelineModel(Path.of(System.getProperty("innetagg.onos.p4info")).toUri().toURL());
    }

    @Test
    public void onosCopyOfTheP4InfoKeepsEveryTableActionAndRegister() throws Exception {
        String committed = Files.readString(Path.of(System.getProperty("innetagg.p4info")));
        assertEquals(count(committed, "\\ntables \\{"), model.tables().size());
        assertEquals(count(committed, "\\nregisters \\{"), model.registers().size());
        long actions = model.tables().stream().flatMap(t -> t.actions().stream()).map(a -> a.id()).distinct().count();
        // insert_int and strip_int are called from apply blocks, so no table lists them.
        assertEquals(count(committed, "\\nactions \\{") - 2, actions);
    }

    private static long count(String text, String regex) {
        return java.util.regex.Pattern.compile(regex).matcher(text).results().count();
    }

    @Test
    public void pipeconfBundlesTheP4InfoAndTheBmv2Json() {
        PiPipeconf pipeconf = PipeconfLoader.buildPipeconf();
        assertEquals(PipeconfLoader.PIPECONF_ID, pipeconf.id());
        assertTrue(pipeconf.extension(PiPipeconf.ExtensionType.BMV2_JSON).isPresent());
        assertTrue(pipeconf.pipelineModel().table(INGRESS_PIPE_FORWARDING_TABLE0).isPresent());
    }

    @Test
    public void everyGeneratedConstantNamesSomethingOfThePipeline() throws Exception {
        List<String> unknown = new ArrayList<>();
        int checked = 0;
        for (Field f : P4InfoConstants.class.getFields()) {
            if (!Modifier.isStatic(f.getModifiers())) {
                continue;
            }
            Object v = f.get(null);
            boolean found;
            if (v instanceof PiTableId) {
                found = model.table((PiTableId) v).isPresent();
            } else if (v instanceof PiActionId) {
                found = model.tables().stream().anyMatch(t -> t.action((PiActionId) v).isPresent())
                        || v.toString().startsWith("EgressPipe.int_egress.");  // called from apply, in no table
            } else if (v instanceof PiMatchFieldId) {
                found = model.tables().stream().anyMatch(t -> t.matchField((PiMatchFieldId) v).isPresent());
            } else if (v instanceof PiActionParamId) {
                found = model.tables().stream().flatMap(t -> t.actions().stream())
                        .anyMatch(a -> a.param((PiActionParamId) v).isPresent());
            } else if (v instanceof PiRegisterId) {
                found = model.register((PiRegisterId) v).isPresent();
            } else if (v instanceof PiCounterId) {
                found = model.counter((PiCounterId) v).isPresent()
                        || model.tables().stream().anyMatch(t -> t.counters().stream().anyMatch(c -> c.id().equals(v)));
            } else if (v instanceof PiPacketMetadataId) {
                found = model.packetOperationModel(PiPacketOperationType.PACKET_IN).orElseThrow().metadatas()
                        .stream().anyMatch(m -> m.id().equals(v))
                        || model.packetOperationModel(PiPacketOperationType.PACKET_OUT).orElseThrow().metadatas()
                        .stream().anyMatch(m -> m.id().equals(v));
            } else {
                continue;  // sizes and bit widths
            }
            checked++;
            if (!found) {
                unknown.add(f.getName() + " = " + v);
            }
        }
        assertTrue("too few constants checked: " + checked, checked > 40);
        assertEquals(List.of(), unknown);
    }

    @Test
    public void everyMappedCriterionIsAMatchFieldOfTable0() {
        PiTableModel table0 = model.table(INGRESS_PIPE_FORWARDING_TABLE0).orElseThrow();
        for (Map.Entry<Criterion.Type, PiMatchFieldId> e : InterpreterImpl.CRITERIA.entrySet()) {
            assertEquals(e.getValue(), interpreter.mapCriterionType(e.getKey()).orElseThrow());
            assertTrue(e.getKey() + " -> " + e.getValue(), table0.matchField(e.getValue()).isPresent());
        }
        // What the intents and discovery of ONOS need.
        for (Criterion.Type t : List.of(Criterion.Type.IN_PORT, Criterion.Type.ETH_DST, Criterion.Type.ETH_SRC,
                Criterion.Type.ETH_TYPE, Criterion.Type.IPV4_SRC, Criterion.Type.IPV4_DST)) {
            assertTrue(t.toString(), interpreter.mapCriterionType(t).isPresent());
        }
        assertFalse(interpreter.mapCriterionType(Criterion.Type.VLAN_VID).isPresent());
        assertEquals(INGRESS_PIPE_FORWARDING_TABLE0, interpreter.mapFlowRuleTableId(0).orElseThrow());
        assertFalse(interpreter.mapFlowRuleTableId(1).isPresent());
    }

    @Test
    public void outputToAPortSetsTheEgressPort() throws Exception {
        PiAction action = interpreter.mapTreatment(
                DefaultTrafficTreatment.builder().setOutput(PortNumber.portNumber(3)).build(),
                INGRESS_PIPE_FORWARDING_TABLE0);
        assertEquals(INGRESS_PIPE_FORWARDING_SET_EGRESS_PORT, action.id());
        PiActionParam port = action.parameters().iterator().next();
        assertEquals(1, action.parameters().size());
        assertEquals(PORT, port.id());
        assertEquals(3, InterpreterImpl.unsigned(port.value()));
        assertActionOfTable0(action);
    }

    @Test
    public void controllerAndDropMapOntoTheirActions() throws Exception {
        PiAction punt = interpreter.mapTreatment(DefaultTrafficTreatment.builder().punt().build(),
                INGRESS_PIPE_FORWARDING_TABLE0);
        assertEquals(INGRESS_PIPE_FORWARDING_SEND_TO_CPU, punt.id());
        assertActionOfTable0(punt);
        PiAction drop = interpreter.mapTreatment(DefaultTrafficTreatment.emptyTreatment(),
                INGRESS_PIPE_FORWARDING_TABLE0);
        assertEquals(INGRESS_PIPE_FORWARDING_DROP, drop.id());
        assertActionOfTable0(drop);
        assertEquals(INGRESS_PIPE_FORWARDING_DROP, interpreter.mapTreatment(
                DefaultTrafficTreatment.builder().drop().build(), INGRESS_PIPE_FORWARDING_TABLE0).id());
        assertEquals(P4InfoConstants.CPU_PORT, (int) interpreter.mapLogicalPortNumber(PortNumber.CONTROLLER)
                .orElseThrow());
    }

    @Test
    public void unsupportedTreatmentsAreRefused() {
        assertRefused(DefaultTrafficTreatment.builder().setEthDst(MacAddress.BROADCAST)
                .setOutput(PortNumber.portNumber(1)).build());
        assertRefused(DefaultTrafficTreatment.builder().setOutput(PortNumber.FLOOD).build());
    }

    @Test
    public void packetInCarriesTheIngressPort() throws Exception {
        Ethernet eth = new Ethernet().setSourceMACAddress("00:00:00:00:00:01")
                .setDestinationMACAddress("00:00:00:00:00:02").setEtherType(Ethernet.TYPE_LLDP);
        eth.setPayload(new org.onlab.packet.Data(new byte[46]));
        PiPacketOperation in = PiPacketOperation.builder()
                .withType(PiPacketOperationType.PACKET_IN)
                .withData(ImmutableByteSequence.copyFrom(eth.serialize()))
                .withMetadata(PiPacketMetadata.builder().withId(PACKET_IN_INGRESS_PORT)
                        .withValue(ImmutableByteSequence.copyFrom((short) 258)).build())
                .build();
        InboundPacket packet = interpreter.mapInboundPacket(in, DeviceId.deviceId("device:s1"));
        assertEquals(PortNumber.portNumber(258), packet.receivedFrom().port());
        assertEquals(MacAddress.valueOf("00:00:00:00:00:02"), packet.parsed().getDestinationMAC());
    }

    @Test
    public void packetOutSetsTheEgressPortMetadata() throws Exception {
        Collection<PiPacketOperation> ops = interpreter.mapOutboundPacket(new DefaultOutboundPacket(
                DeviceId.deviceId("device:s1"),
                DefaultTrafficTreatment.builder().setOutput(PortNumber.portNumber(5)).build(),
                ByteBuffer.wrap(new byte[60])));
        assertEquals(1, ops.size());
        PiPacketMetadata md = ops.iterator().next().metadatas().iterator().next();
        assertEquals(PACKET_OUT_EGRESS_PORT, md.id());
        assertEquals(5, InterpreterImpl.unsigned(md.value()));
        assertTrue(model.packetOperationModel(PiPacketOperationType.PACKET_OUT).orElseThrow().metadatas()
                .stream().anyMatch(m -> m.id().equals(md.id()) && m.bitWidth() == P4InfoConstants
                        .PACKET_OUT_EGRESS_PORT_BITWIDTH));
    }

    private void assertRefused(org.onosproject.net.flow.TrafficTreatment t) {
        try {
            interpreter.mapTreatment(t, INGRESS_PIPE_FORWARDING_TABLE0);
            fail("mapped " + t);
        } catch (PiInterpreterException expected) {
            // refused, as it should be
        }
    }

    private static void assertActionOfTable0(PiAction action) {
        PiActionModel a = model.table(INGRESS_PIPE_FORWARDING_TABLE0).orElseThrow().action(action.id())
                .orElseThrow(() -> new AssertionError(action.id() + " is not an action of table0"));
        assertEquals(a.params().size(), action.parameters().size());
        action.parameters().forEach(p -> assertTrue(p.id() + " of " + a.id(), a.param(p.id()).isPresent()));
    }
}
