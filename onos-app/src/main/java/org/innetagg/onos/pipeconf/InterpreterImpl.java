package org.innetagg.onos.pipeconf;

import com.google.common.collect.ImmutableList;
import com.google.common.collect.ImmutableMap;
import org.onlab.packet.DeserializationException;
import org.onlab.packet.Ethernet;
import org.onlab.util.ImmutableByteSequence;
import org.onosproject.net.ConnectPoint;
import org.onosproject.net.DeviceId;
import org.onosproject.net.Port;
import org.onosproject.net.PortNumber;
import org.onosproject.net.device.DeviceService;
import org.onosproject.net.driver.AbstractHandlerBehaviour;
import org.onosproject.net.flow.TrafficTreatment;
import org.onosproject.net.flow.criteria.Criterion;
import org.onosproject.net.flow.instructions.Instruction;
import org.onosproject.net.flow.instructions.Instructions.OutputInstruction;
import org.onosproject.net.packet.DefaultInboundPacket;
import org.onosproject.net.packet.InboundPacket;
import org.onosproject.net.packet.OutboundPacket;
import org.onosproject.net.pi.model.PiMatchFieldId;
import org.onosproject.net.pi.model.PiPipelineInterpreter;
import org.onosproject.net.pi.model.PiTableId;
import org.onosproject.net.pi.runtime.PiAction;
import org.onosproject.net.pi.runtime.PiActionParam;
import org.onosproject.net.pi.runtime.PiPacketMetadata;
import org.onosproject.net.pi.runtime.PiPacketOperation;

import java.nio.ByteBuffer;
import java.util.Collection;
import java.util.Map;
import java.util.Optional;

import static org.innetagg.onos.pipeconf.P4InfoConstants.CPU_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_ETHERNET_DST_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_ETHERNET_ETHER_TYPE;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_ETHERNET_SRC_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_DST_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_PROTOCOL;
import static org.innetagg.onos.pipeconf.P4InfoConstants.HDR_IPV4_SRC_ADDR;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_DROP;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_SEND_TO_CPU;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_SET_EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.INGRESS_PIPE_FORWARDING_TABLE0;
import static org.innetagg.onos.pipeconf.P4InfoConstants.LOCAL_METADATA_L4_DST_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.LOCAL_METADATA_L4_SRC_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PACKET_IN_INGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PACKET_OUT_EGRESS_PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PACKET_OUT_EGRESS_PORT_BITWIDTH;
import static org.innetagg.onos.pipeconf.P4InfoConstants.PORT;
import static org.innetagg.onos.pipeconf.P4InfoConstants.STANDARD_METADATA_INGRESS_PORT;
import static org.onosproject.net.PortNumber.CONTROLLER;
import static org.onosproject.net.PortNumber.FLOOD;
import static org.onosproject.net.pi.model.PiPacketOperationType.PACKET_OUT;

/**
 * Maps ONOS flow rules for table 0 (what intents, host and link discovery produce) onto
 * {@code IngressPipe.forwarding.table0}, and packet-in/out onto the controller headers.
 */
public class InterpreterImpl extends AbstractHandlerBehaviour implements PiPipelineInterpreter {

    static final Map<Criterion.Type, PiMatchFieldId> CRITERIA = ImmutableMap.<Criterion.Type, PiMatchFieldId>builder()
            .put(Criterion.Type.IN_PORT, STANDARD_METADATA_INGRESS_PORT)
            .put(Criterion.Type.ETH_SRC, HDR_ETHERNET_SRC_ADDR)
            .put(Criterion.Type.ETH_DST, HDR_ETHERNET_DST_ADDR)
            .put(Criterion.Type.ETH_TYPE, HDR_ETHERNET_ETHER_TYPE)
            .put(Criterion.Type.IPV4_SRC, HDR_IPV4_SRC_ADDR)
            .put(Criterion.Type.IPV4_DST, HDR_IPV4_DST_ADDR)
            .put(Criterion.Type.IP_PROTO, HDR_IPV4_PROTOCOL)
            // Both transports land in the same metadata: the parser copies whichever is valid.
            .put(Criterion.Type.TCP_SRC, LOCAL_METADATA_L4_SRC_PORT)
            .put(Criterion.Type.UDP_SRC, LOCAL_METADATA_L4_SRC_PORT)
            .put(Criterion.Type.TCP_DST, LOCAL_METADATA_L4_DST_PORT)
            .put(Criterion.Type.UDP_DST, LOCAL_METADATA_L4_DST_PORT)
            .build();

    @Override
    public Optional<PiMatchFieldId> mapCriterionType(Criterion.Type type) {
        return Optional.ofNullable(CRITERIA.get(type));
    }

    @Override
    public Optional<PiTableId> mapFlowRuleTableId(int flowRuleTableId) {
        return flowRuleTableId == 0 ? Optional.of(INGRESS_PIPE_FORWARDING_TABLE0) : Optional.empty();
    }

    @Override
    public PiAction mapTreatment(TrafficTreatment treatment, PiTableId tableId) throws PiInterpreterException {
        if (!INGRESS_PIPE_FORWARDING_TABLE0.equals(tableId)) {
            throw new PiInterpreterException("treatments map only onto " + INGRESS_PIPE_FORWARDING_TABLE0
                    + ", not " + tableId);
        }
        // ONOS's drop (builder().drop(), emptyTreatment()) is a lone NOACTION instruction.
        if (treatment.allInstructions().stream().allMatch(i -> i.type() == Instruction.Type.NOACTION)) {
            return PiAction.builder().withId(INGRESS_PIPE_FORWARDING_DROP).build();
        }
        if (treatment.allInstructions().size() > 1) {
            throw new PiInterpreterException("only one OUTPUT instruction is supported: " + treatment);
        }
        Instruction instruction = treatment.allInstructions().get(0);
        if (instruction.type() != Instruction.Type.OUTPUT) {
            throw new PiInterpreterException("instruction " + instruction.type() + " is not supported");
        }
        PortNumber port = ((OutputInstruction) instruction).port();
        if (CONTROLLER.equals(port)) {
            return PiAction.builder().withId(INGRESS_PIPE_FORWARDING_SEND_TO_CPU).build();
        }
        if (port.isLogical()) {
            throw new PiInterpreterException("output to logical port " + port + " is not supported");
        }
        return PiAction.builder()
                .withId(INGRESS_PIPE_FORWARDING_SET_EGRESS_PORT)
                .withParameter(new PiActionParam(PORT, port.toLong()))
                .build();
    }

    @Override
    public Collection<PiPacketOperation> mapOutboundPacket(OutboundPacket packet) throws PiInterpreterException {
        ImmutableList.Builder<PiPacketOperation> ops = ImmutableList.builder();
        for (Instruction instruction : packet.treatment().allInstructions()) {
            if (instruction.type() != Instruction.Type.OUTPUT) {
                throw new PiInterpreterException("packet-out supports OUTPUT only: " + packet.treatment());
            }
            PortNumber port = ((OutputInstruction) instruction).port();
            if (FLOOD.equals(port)) {
                // The pipeline has no multicast group for flooding: one packet-out per port.
                DeviceService devices = handler().get(DeviceService.class);
                for (Port p : devices.getPorts(packet.sendThrough())) {
                    if (!p.number().isLogical()) {
                        ops.add(packetOut(packet.data(), p.number().toLong()));
                    }
                }
            } else if (port.isLogical()) {
                throw new PiInterpreterException("packet-out to logical port " + port + " is not supported");
            } else {
                ops.add(packetOut(packet.data(), port.toLong()));
            }
        }
        return ops.build();
    }

    @Override
    public InboundPacket mapInboundPacket(PiPacketOperation packetIn, DeviceId deviceId)
            throws PiInterpreterException {
        Optional<PiPacketMetadata> ingress = packetIn.metadatas().stream()
                .filter(m -> m.id().equals(PACKET_IN_INGRESS_PORT))
                .findFirst();
        if (ingress.isEmpty()) {
            throw new PiInterpreterException("packet-in from " + deviceId + " lacks " + PACKET_IN_INGRESS_PORT);
        }
        byte[] data = packetIn.data().asArray();
        Ethernet eth;
        try {
            eth = Ethernet.deserializer().deserialize(data, 0, data.length);
        } catch (DeserializationException e) {
            throw new PiInterpreterException("packet-in from " + deviceId + ": " + e.getMessage());
        }
        ConnectPoint from = new ConnectPoint(deviceId, PortNumber.portNumber(unsigned(ingress.get().value())));
        return new DefaultInboundPacket(from, eth, ByteBuffer.wrap(data));
    }

    @Override
    public Optional<Integer> mapLogicalPortNumber(PortNumber port) {
        return CONTROLLER.equals(port) ? Optional.of(CPU_PORT) : Optional.empty();
    }

    private static PiPacketOperation packetOut(ByteBuffer data, long port) throws PiInterpreterException {
        try {
            return PiPacketOperation.builder()
                    .withType(PACKET_OUT)
                    .withData(ImmutableByteSequence.copyFrom(data))
                    .withMetadata(PiPacketMetadata.builder()
                            .withId(PACKET_OUT_EGRESS_PORT)
                            .withValue(ImmutableByteSequence.copyFrom(port).fit(PACKET_OUT_EGRESS_PORT_BITWIDTH))
                            .build())
                    .build();
        } catch (ImmutableByteSequence.ByteSequenceTrimException e) {
            throw new PiInterpreterException("port " + port + " does not fit "
                    + PACKET_OUT_EGRESS_PORT_BITWIDTH + " bits");
        }
    }

    /** The value of a metadata of any byte length (P4Runtime may send it shortest-form). */
    static long unsigned(ImmutableByteSequence value) {
        long v = 0;
        for (byte b : value.asArray()) {
            v = (v << 8) | (b & 0xff);
        }
        return v;
    }
}
